"""Running untrusted OCaml: a pool of long-lived sandboxed workers that type-check, compile and test.

Each worker owns two processes, started once and reused for every completion it scores:
- a checker (ocaml/checker.ml, built on compiler-libs) that parses, types and compiles a completion
  to bytecode in-process, counting independent type errors;
- a runner (ocaml/runner.ml) that forks one child per completion, loads the compiled test harness
  with Dynlink, and reports the tally of passed assertions, killing the child's process group at the
  deadline.
With bubblewrap both run in a sandbox: system folders read-only, only the worker's temp dir mounted
(writable for the checker, read-only for test programs when we are root), no network, no home, no
/proc, a new PID namespace, dying with the parent. The runner and every child inherit resource limits
(CPU seconds, address space, processes, file size, open files). Without bubblewrap the same processes
run under the limits only.

A completion must never read the tests it is judged by. The compiled unit holds the assertions'
expected values, so it is written 0600 under a random name, and the runner's child unlinks it, closes
every other way to it and (when we are root) drops to the worker's unprivileged uid before any code of
the problem or the completion runs (ocaml/runner.ml says how). docs/sandbox.md lists what a completion
can see and write, channel by channel.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import logging
import os
import resource
import secrets
import select
import shutil
import subprocess
import tempfile
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

APT_INSTALL = "sudo apt-get install -y ocaml-nox ocaml-findlib bubblewrap"
OCAML_SOURCES = Path(__file__).resolve().parent / "ocaml"
SANDBOX_MODES = ("auto", "bwrap", "rlimit")
# Worker i's test programs run as uid RUNNER_UID_BASE + i (when we are root): a uid of their own, so
# that RLIMIT_NPROC counts only their processes and a fork bomb in one worker cannot starve another.
RUNNER_UID_BASE = 62000
MAX_REPLY_BYTES = 1 << 20
# The runner's open-file limit; the runner is told it (--open-files) and closes every descriptor below it
# that the test program must not keep before a completion runs.
OPEN_FILES = 64


class ToolchainMissing(RuntimeError):
    """ocamlc or ocamlfind is not on PATH; the message names the packages to install."""


def check_toolchain() -> None:
    missing = [tool for tool in ("ocamlc", "ocamlfind") if shutil.which(tool) is None]
    if missing:
        raise ToolchainMissing(
            f"OCaml toolchain missing ({', '.join(missing)} not on PATH). Install it with:\n  {APT_INSTALL}"
        )


@dataclass(frozen=True)
class Limits:
    compile_timeout: float = 10.0
    run_timeout: float = 5.0
    memory_mb: int = 1024


@dataclass(frozen=True)
class Job:
    """One program to check: the problem's definitions, the solution code, the tests, the function."""

    types: str
    code: str
    tests: str
    function: str

    @functools.cached_property
    def key(self) -> str:
        parts = (self.types, self.code, self.tests, self.function)
        return hashlib.sha256("\0".join(parts).encode("utf-8", "replace")).hexdigest()[:32]


@dataclass
class Outcome:
    """What the toolchain said about one program. `verdicts` maps assertion index to pass/fail/exn."""

    syntax_errors: int = 0
    type_errors: int = 0
    definitions: int = 0
    definitions_ok: int = 0
    compiled: bool = False
    tests_total: int = 0
    verdicts: dict[int, str] = field(default_factory=dict)
    ended: str = ""  # how the test program ended: "exit 0", "signal 9", "timeout", ...
    # The first compiler error (in "solution.ml", the code as scored, or "tests.ml"), else the first
    # assertion that raised (first_failure); never a path of the worker's folders.
    error_sample: str = ""
    assert_lines: list[int] = field(default_factory=list)  # the tests' line of each assertion, in order
    # A solution that does not parse: how many single-token edits (1 to 3) made it parse, 0 when none did,
    # and the independent type errors of the text so repaired (ocaml/checker.ml). Only the grade uses them.
    syntax_repairs: int = 0
    repaired_type_errors: int = 0

    @property
    def tests_passed(self) -> int:
        return sum(v == "pass" for v in self.verdicts.values())


def first_failure(outcome: Outcome, raised: bool = False) -> str:
    """The first assertion that did not pass (with `raised`, that raised), placed by its line in the
    tests: the trusted side keeps the lines (the test program never sees them), so that the logs can
    say which assertion went wrong."""
    for index in range(1, outcome.tests_total + 1):
        verdict = outcome.verdicts.get(index, "")
        if verdict == "pass" or (raised and not verdict.startswith("exn")):
            continue
        if verdict.startswith("exn"):
            what = f"raised {verdict[4:]}"
        else:
            what = "failed" if verdict == "fail" else f"did not finish ({outcome.ended})"
        line = outcome.assert_lines[index - 1] if index <= len(outcome.assert_lines) else 0
        place = f'File "tests.ml", line {line}: ' if line else ""
        return f"{place}assertion {index} of {outcome.tests_total} {what}"[:300]
    return ""


# --- building the OCaml side --------------------------------------------------------------------------


@functools.cache
def build_tools() -> Path:
    """Compile checker and runner once per process into a temp dir (about a quarter of a second)."""
    check_toolchain()
    out = Path(tempfile.mkdtemp(prefix="ocaml-reward-tools-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    for name in ("tally.ml", "runner.ml", "checker.ml"):
        shutil.copy(OCAML_SOURCES / name, out / name)
    checker = ["-package", "compiler-libs.bytecomp", "-linkpkg", "checker.ml", "-o", "checker"]
    runner = [
        "-package",
        "unix,dynlink",
        "-linkpkg",
        "-linkall",
        "tally.ml",
        "runner.ml",
        "-o",
        "runner.byte",
    ]
    # A native checker is about three times faster; ocamlopt needs a working C linker, so bytecode is the
    # fallback.
    for compiler in ("ocamlopt", "ocamlc"):
        if _ocamlfind(compiler, checker, out) is None:
            break
    else:
        raise RuntimeError(
            f"building the reward's OCaml checker failed:\n{_ocamlfind('ocamlc', checker, out)}"
        )
    if (problem := _ocamlfind("ocamlc", runner, out)) is not None:
        raise RuntimeError(f"building the reward's OCaml runner failed:\n{problem}")
    # The checker's whole load path: the standard library and Tally, so that a completion cannot even
    # name Unix, Dynlink or Str, although the runner has some of them linked in.
    include = out / "include"
    include.mkdir()
    shutil.copy(out / "tally.cmi", include / "tally.cmi")
    stdlib = Path(
        subprocess.run(["ocamlc", "-where"], capture_output=True, text=True, check=True).stdout.strip()
    )
    for cmi in stdlib.glob("*.cmi"):
        if cmi.name.startswith(("stdlib", "camlinternal", "std_exit")):
            (include / cmi.name).symlink_to(cmi)
    os.chmod(out, 0o755)
    return out


def _ocamlfind(compiler: str, args: list[str], cwd: Path) -> str | None:
    """None on success, else the compiler's complaint."""
    done = subprocess.run(
        ["ocamlfind", compiler, *args], cwd=cwd, capture_output=True, text=True, errors="replace"
    )
    return None if done.returncode == 0 else done.stderr[-2000:]


# --- sandbox ----------------------------------------------------------------------------------------


def bwrap_args(workdir: Path, tools: Path, init: bool = False) -> list[str]:
    """The sandbox around `argv`; with `init`, argv is the PID namespace's init, so that every process
    in it is argv's descendant (the runner counts on it to find what a completion left running)."""
    args = ["bwrap", "--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    args += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache", "--dev", "/dev"]
    # bwrap would create the folders above our mounts 0700, out of the runner uid's reach.
    for parent in sorted({str(p) for path in (workdir, tools) for p in path.parents if str(p) != "/"}):
        args += ["--perms", "0755", "--dir", parent]
    args += [
        "--ro-bind",
        str(tools),
        str(tools),
        "--bind",
        str(workdir),
        str(workdir),
        "--chdir",
        str(workdir),
        # The sandbox's own tmpfs folders (its /tmp, the folders above our mounts, /dev and /dev/shm)
        # read-only; device nodes still work. A trainer that is not root runs test programs as its own
        # uid, which owns them and could otherwise leave files there for the completions after it.
        "--remount-ro",
        "/",
        "--remount-ro",
        "/dev",
    ]
    # No user namespace: as root we want the runner's uid to be a real unprivileged uid on the host.
    args += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    if init:
        args.append("--as-pid-1")
    return [*args, "--die-with-parent", "--new-session", "--"]


_mode_lock = threading.Lock()


@functools.cache
def _bwrap_works() -> str | None:
    """None when bubblewrap can start a sandbox here, else why not."""
    if shutil.which("bwrap") is None:
        return "bwrap is not installed"
    with tempfile.TemporaryDirectory() as tmp:
        probe = [*bwrap_args(Path(tmp), Path(tmp)), "/bin/true"]
        try:
            done = subprocess.run(probe, capture_output=True, text=True, errors="replace", timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return str(exc)
        return None if done.returncode == 0 else done.stderr.strip()[:300] or f"exit {done.returncode}"


def sandbox_mode(requested: str) -> str:
    """The mode to use: bwrap where it runs, else rlimit with one warning. A forced bwrap must run."""
    if requested not in SANDBOX_MODES:
        raise ValueError(f"OCAML_SANDBOX={requested!r}: expected one of {', '.join(SANDBOX_MODES)}")
    if requested == "rlimit":
        return "rlimit"
    with _mode_lock:
        problem = _bwrap_works()
    if problem is None:
        return "bwrap"
    if requested == "bwrap":
        raise RuntimeError(f"OCAML_SANDBOX=bwrap but bubblewrap cannot start a sandbox here: {problem}")
    _warn_no_bwrap(problem)
    return "rlimit"


@functools.cache
def _warn_no_bwrap(problem: str) -> None:
    log.warning(
        "bubblewrap cannot start a sandbox here (%s): running OCaml under resource limits only, without "
        "file-system and network isolation. Install bubblewrap with user namespaces enabled, or set "
        "OCAML_SANDBOX=rlimit to silence this warning.",
        problem,
    )


@functools.cache
def _warn_unsealed(problem: str) -> None:
    # Every completion would score as failing its tests: say so once, loudly.
    log.error(
        "the reward cannot run tests without exposing them (%s): no test passes until this is fixed", problem
    )


def _limit_child(limits: Limits, uid: int | None):
    """preexec_fn for the runner: resource limits, inherited by each test program. The process cap only
    where test programs get a uid of their own: it counts every process of the uid."""
    cpu = max(1, int(limits.run_timeout) + 1)
    memory = limits.memory_mb << 20

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))
        if uid is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (32, 32))

    return apply


class _Process:
    """A long-lived helper: requests to its stdin, reply lines from its stdout."""

    def __init__(self, argv: list[str], cwd: Path, preexec_fn=None) -> None:
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "OCAMLRUNPARAM": "l=256k"}
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            preexec_fn=preexec_fn,
            cwd=cwd,
            start_new_session=True,
        )
        self.buffer = b""

    def send(self, request: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(request)
        self.proc.stdin.flush()

    def read_line(self, deadline: float) -> str | None:
        """The next reply line, or None when the process died or the deadline passed."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk or len(self.buffer) > MAX_REPLY_BYTES:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode("utf-8", errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 9)
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


class _Worker:
    """One checker and one runner, each started once; handles one job at a time."""

    def __init__(self, index: int, root: Path, mode: str, limits: Limits) -> None:
        self.dir = root / f"worker{index}"
        self.dir.mkdir(mode=0o755)
        self.mode = mode
        self.limits = limits
        self.tools = build_tools()
        self.uid = RUNNER_UID_BASE + index if os.geteuid() == 0 else None
        self.checker: _Process | None = None
        self.runner: _Process | None = None

    def _sandboxed(self, argv: list[str], init: bool = False) -> list[str]:
        return bwrap_args(self.dir, self.tools, init) + argv if self.mode == "bwrap" else argv

    def _start_checker(self) -> _Process:
        argv = [str(self.tools / "checker"), str(self.tools / "include")]
        memory = 2 * (self.limits.memory_mb << 20)

        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
            os.umask(0o077)  # the compiled tests: readable by our own user only

        return _Process(self._sandboxed(argv), self.dir, preexec_fn=limit)

    def _start_runner(self) -> _Process:
        # The runner keeps our uid: each child reads its unit, unlinks it, and only then drops to
        # self.uid, before the completion runs (ocaml/runner.ml).
        argv = [str(self.tools / "runner.byte"), "--open-files", str(OPEN_FILES)]
        if self.uid is not None:
            argv += ["--uid", str(self.uid)]
        if self.mode == "bwrap":
            # As the init of its own PID namespace the runner sees, and kills, whatever a job left running.
            argv.append("--sweep")
        sandboxed = self._sandboxed(argv, init=True)
        return _Process(sandboxed, self.dir, preexec_fn=_limit_child(self.limits, self.uid))

    def evaluate(self, job: Job) -> Outcome:
        # A random name: no earlier completion can have planted a file under it.
        token = secrets.token_hex(16)
        module = f"U{token}"
        try:
            outcome = self._check(job, module)
            unit = self.dir / f"u{token}.cmo"
            if outcome.compiled:
                self._run(unit, outcome)
            outcome.error_sample = self._scrubbed(outcome.error_sample, unit)
            if outcome.compiled and not outcome.error_sample:
                outcome.error_sample = first_failure(outcome, raised=True)
            return outcome
        finally:
            self._clear()

    def _clear(self) -> None:
        """Empties the worker's folder: the unit if it was never run, and anything a test program left
        (possible only when we are not root), so that no completion sees another's files."""
        for entry in os.scandir(self.dir):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)

    def _scrubbed(self, sample: str, unit: Path | None = None) -> str:
        """The worker's folders are no business of the logs: messages name the program's own files, and the
        compiled test `unit` (the runner's load errors name it) is `the test program`."""
        if unit is not None:
            sample = sample.replace(str(unit), "the test program")
        for folder in (self.dir, self.tools):
            sample = sample.replace(f"{folder}/", "").replace(str(folder), ".")
        return sample

    def _check(self, job: Job, module: str) -> Outcome:
        if self.checker is None or self.checker.proc.poll() is not None:
            self.checker = self._start_checker()
        texts = [t.encode("utf-8", errors="replace") for t in (job.types, job.code, job.tests)]
        sizes = " ".join(str(len(t)) for t in texts)
        self.checker.send(f"{self.dir} {module} {job.function} {sizes}".encode() + b"\n" + b"".join(texts))
        reply = self.checker.read_line(time.monotonic() + self.limits.compile_timeout)
        if reply is None:
            # A runaway type-checker (or a crash): restart it and report the completion as not compiling.
            self.checker.stop()
            self.checker = None
            return Outcome(ended="compile timeout", error_sample="the compiler timed out or crashed")
        # The checker's error_sample has no tab in it, so every field splits off.
        fields = reply.split("\t")
        numbers = [int(x) for x in fields[:6]]
        repairs = [int(x) for x in fields[8:10]] + [0, 0]
        return Outcome(
            syntax_errors=numbers[0],
            type_errors=numbers[1],
            definitions=numbers[2],
            definitions_ok=numbers[3],
            compiled=numbers[4] == 1,
            tests_total=numbers[5],
            assert_lines=[int(x) for x in fields[6].split(",") if x] if len(fields) > 6 else [],
            error_sample=fields[7][:300] if len(fields) > 7 else "",
            syntax_repairs=repairs[0],
            repaired_type_errors=repairs[1],
        )

    def _run(self, cmo: Path, outcome: Outcome) -> None:
        """Fills outcome.verdicts from the lines that carry this run's nonce, each index counted once."""
        if self.runner is None or self.runner.proc.poll() is not None:
            self.runner = self._start_runner()
        nonce = secrets.token_hex(16)
        timeout_ms = int(self.limits.run_timeout * 1000)
        self.runner.send(f"{cmo} {nonce} {timeout_ms}\n".encode())
        deadline = time.monotonic() + self.limits.run_timeout + 5.0
        while (line := self.runner.read_line(deadline)) is not None:
            if line.startswith("E "):
                outcome.ended = line[2:]
                break
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[0] == "R" and parts[1] == nonce:
                index, verdict = parts[2], (parts[3] if len(parts) > 3 else "")
                if verdict.startswith("exn"):
                    verdict = self._scrubbed(verdict)
                if index.isdigit() and 1 <= int(index) <= outcome.tests_total:
                    outcome.verdicts.setdefault(int(index), verdict)
            elif line.startswith("R ! ") and not outcome.error_sample:
                outcome.error_sample = line[4:300]  # the test program could not load or seal
                if outcome.error_sample.startswith("sealing"):
                    _warn_unsealed(outcome.error_sample)
        else:
            self.runner.stop()
            self.runner = None
            outcome.ended = "runner failed"

    def stop(self) -> None:
        for process in (self.checker, self.runner):
            if process is not None:
                process.stop()


class SandboxPool:
    """Workers that score jobs concurrently; results are cached by content hash."""

    def __init__(
        self, workers: int = 0, mode: str = "auto", limits: Limits | None = None, cache_size: int = 4096
    ):
        check_toolchain()
        self.mode = sandbox_mode(mode)
        self.limits = limits or Limits()
        count = workers or os.cpu_count() or 1
        self.root = Path(tempfile.mkdtemp(prefix="ocaml-reward-"))
        os.chmod(self.root, 0o755)
        self.idle: list[_Worker] = [_Worker(i, self.root, self.mode, self.limits) for i in range(count)]
        self.all_workers = list(self.idle)
        self.idle_lock = threading.Lock()
        self.executor = ThreadPoolExecutor(max_workers=count, thread_name_prefix="ocaml-worker")
        self.cache: OrderedDict[str, Future[Outcome]] = OrderedDict()
        self.cache_size = cache_size
        self.cache_lock = threading.Lock()

    def submit(self, job: Job) -> Future[Outcome]:
        """A future outcome; identical jobs share one evaluation (GRPO groups repeat completions)."""
        with self.cache_lock:
            future = self.cache.get(job.key)
            if future is not None:
                self.cache.move_to_end(job.key)
                return future
            future = self.executor.submit(self._evaluate, job)
            self.cache[job.key] = future
            while len(self.cache) > self.cache_size:
                self.cache.popitem(last=False)
            return future

    def evaluate_many(self, jobs: list[Job]) -> list[Outcome]:
        futures = [self.submit(job) for job in jobs]
        return [f.result() for f in futures]

    def _evaluate(self, job: Job) -> Outcome:
        with self.idle_lock:
            worker = self.idle.pop()
        try:
            return worker.evaluate(job)
        except Exception as exc:  # a bug here must cost one completion its score, not the training run
            log.exception("scoring a completion failed")
            return Outcome(ended=f"internal error: {exc}", error_sample=f"internal error: {exc}"[:300])
        finally:
            with self.idle_lock:
                self.idle.append(worker)

    def close(self) -> None:
        self.executor.shutdown(wait=True)
        for worker in self.all_workers:
            worker.stop()
        shutil.rmtree(self.root, ignore_errors=True)
