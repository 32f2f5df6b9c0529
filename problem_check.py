"""Broken problems found before they cost a training step or an evaluation sample.

A problem is usable when its tests compile against the prompt's signature with a stub body, hold at least one
assertion, and, where the row has a reference solution, that solution passes every one of them. A problem
whose tests cannot compile gives every completion of a GRPO group the same reward (a zero-std group caused by
the data), and in evaluation it charges the problem's fault to the model.

The check runs the reward's own sandbox (ocaml_sandbox.SandboxPool, one worker per core), and each verdict is
cached by content: the programs it runs (the prompt's types and signature, the tests, the reference solution
as the reward assembles it) and the toolchain (the compiler's version and our OCaml sources). The cache is one
append-only file, $XDG_CACHE_HOME/ocaml-grpo/problem-check.jsonl (~/.cache/ocaml-grpo/ by default); delete it
to check everything again.

    python rewards.py check PROBLEMS     # one line per broken problem, then `N of M problems usable`
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from multipl_e import Val, function_calls, repair_hint, repair_problems, signature
from ocaml_sandbox import OCAML_SOURCES, Job, Limits, Outcome, SandboxPool
from problems import Problem, load_problems, load_rows, parse_problem, usable_problems

CACHE_FILE = "problem-check.jsonl"
# Bumped whenever what the check asks changes, so that older verdicts are not reused.
CHECK_VERSION = "3"
STUB_BODY = "  assert false"  # of every type, so it fits whatever the signature returns
NEGATION = re.compile(r"(~-\.|~-|-\.|-|~)?(.*)", re.S)  # a literal's sign, as OCaml or MultiPL-E writes it

# The reward's assembly of a solution into a program (rewards.reference_program), handed in by the caller:
# the reward's CLI runs this check, so this module cannot import the reward.
Assemble = Callable[[Problem, str], str]


class CheckSettings(Protocol):
    """What the check reads of a RewardConfig (or a TrainConfig, which extends it)."""

    reward_workers: int
    ocaml_sandbox: str
    repair_problems: bool

    def limits(self) -> Limits: ...


@dataclass
class CheckResult:
    broken: list[tuple[str, str]]  # (problem id, the first error line), in the problems' order
    total: int
    cached: int  # verdicts read from the cache rather than computed
    seconds: float

    @property
    def usable(self) -> int:
        return self.total - len(self.broken)

    def summary(self) -> str:
        return f"{self.usable} of {self.total} problems usable"


def stub_job(problem: str, tests: str) -> Job:
    """The prompt's own signature with a body that compiles whatever the function returns."""
    parsed = parse_problem(problem)
    return Job(parsed.types, f"{parsed.signature}\n{STUB_BODY}", tests, parsed.function)


def reference_job(problem: str, tests: str, solution: str, assemble: Assemble) -> Job:
    """The reference solution, assembled as the reward assembles a completion (a body gets the signature)."""
    parsed = parse_problem(problem)
    return Job(parsed.types, assemble(parsed, solution), tests, parsed.function)


def first_line(text: str) -> str:
    return (text.strip().splitlines() or ["(no message)"])[0].removeprefix("checker: ")


def stub_error(outcome: Outcome, tests: str, problem: str = "") -> str | None:
    """Why the tests do not fit the signature, or None when they do; a MultiPL-E rendering bug in the prompt
    or the tests is named where there is one."""
    if not outcome.compiled:
        error = first_line(outcome.error_sample)
        return f"the tests do not compile against the signature: {error}{repair_hint(tests, problem)}"
    if outcome.tests_total == 0:
        return "the tests hold no `assert`, so no completion can earn the tests' share of the reward"
    return None


def reference_error(outcome: Outcome) -> str | None:
    """Why the reference solution fails its tests, or None when it passes every one."""
    if not outcome.compiled:
        return f"the reference solution does not compile with the tests: {first_line(outcome.error_sample)}"
    if outcome.tests_passed < outcome.tests_total:
        detail = f"; {first_line(outcome.error_sample)}" if outcome.error_sample else ""
        return (
            f"the reference solution passes {outcome.tests_passed} of {outcome.tests_total} tests "
            f"({outcome.ended or 'no result'}){detail}"
        )
    return None


def is_definite(outcome: Outcome) -> bool:
    """A verdict worth caching: not a timeout, crash or internal error that a calmer machine would not see."""
    return not outcome.ended.startswith(("compile timeout", "internal error", "runner failed", "timeout"))


@functools.cache
def toolchain_fingerprint() -> str:
    """The compiler's version and our OCaml sources: a change in either checks every problem again."""
    version = subprocess.run(["ocamlc", "-version"], capture_output=True, text=True).stdout.strip()
    sources = b"".join(path.read_bytes() for path in sorted(OCAML_SOURCES.glob("*.ml")))
    return hashlib.sha256(version.encode() + b"\0" + sources).hexdigest()[:16]


def cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ocaml-grpo" / CACHE_FILE


def problem_jobs(problem: Mapping, assemble: Assemble) -> tuple[Job, Job | None]:
    """The programs a problem's verdict rests on: its tests against a stub, and against its reference
    solution when the row has one."""
    stub = stub_job(problem["problem"], problem["tests"])
    solution = problem.get("solution")
    if not (isinstance(solution, str) and solution.strip()):
        return stub, None
    return stub, reference_job(problem["problem"], problem["tests"], solution, assemble)


def verdict_key(jobs: tuple[Job, Job | None]) -> str:
    """The cache key: the very programs run (a change in how the reward assembles them counts) and the
    toolchain that runs them."""
    stub, reference = jobs
    parts = (CHECK_VERSION, toolchain_fingerprint(), stub.key, reference.key if reference else "")
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def read_cache(path: Path) -> dict[str, str | None]:
    """{key: error or None}; a torn or foreign line is ignored, a missing file is an empty cache."""
    verdicts: dict[str, str | None] = {}
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return verdicts
    for line in lines:
        try:
            record = json.loads(line)
            verdicts[str(record["key"])] = record["error"]
        except (ValueError, KeyError, TypeError):
            continue
    return verdicts


def append_cache(path: Path, verdicts: dict[str, str | None]) -> None:
    """One O_APPEND write: processes that check at once (DDP ranks) never interleave their lines."""
    if not verdicts:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError:
        return  # a read-only home costs the next run a cold check, nothing more
    try:
        # A line torn by a killed run is closed first, so that it does not swallow the next verdict.
        size = os.fstat(fd).st_size
        torn = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
        lines = "".join(json.dumps({"key": key, "error": error}) + "\n" for key, error in verdicts.items())
        os.write(fd, (("\n" if torn else "") + lines).encode())
    finally:
        os.close(fd)


def check_problems(
    problems: Sequence[Mapping],
    cfg: CheckSettings,
    assemble: Assemble,
    *,
    cache: Path | None = None,
) -> CheckResult:
    """Every problem ({id, problem, tests, solution?}, as problems.load_problems gives them) checked in the
    sandbox, all jobs at once across the pool's workers; cached verdicts are not computed again."""
    started = time.monotonic()
    cache = cache or cache_path()
    known = read_cache(cache)
    jobs = [problem_jobs(p, assemble) for p in problems]
    keys = [verdict_key(pair) for pair in jobs]
    todo = [i for i, key in enumerate(keys) if key not in known]
    fresh = []
    if todo:
        pool = SandboxPool(cfg.reward_workers, cfg.ocaml_sandbox, cfg.limits())
        try:
            fresh = _verdicts([jobs[i] for i in todo], [problems[i]["problem"] for i in todo], pool)
        finally:
            pool.close()
    new = {}
    for i, (error, definite) in zip(todo, fresh, strict=True):
        known[keys[i]] = error
        if definite:
            new[keys[i]] = error
    append_cache(cache, new)
    broken = [(str(p["id"]), known[key]) for p, key in zip(problems, keys, strict=True) if known[key]]
    return CheckResult(broken, len(problems), len(problems) - len(todo), time.monotonic() - started)


def canonical(value: Val, text: str) -> object:
    """A literal value in a form where two spellings of one value are equal (`(-1)` and `-1`, `1.` and
    `1.0`); None for what is not a literal."""
    if value.kind in ("list", "array", "tuple", "some"):
        items = [canonical(item, text) for item in value.items]
        return None if None in items else (value.kind, *items)
    spelled = text[value.start : value.end]
    if value.kind in ("int", "float"):
        negation, digits = NEGATION.match("".join(spelled.split()).replace("_", "")).groups()
        sign = -1 if negation else 1
        try:
            if value.kind == "float":
                return sign * float(digits)
            return sign * int(digits, 0 if digits[:2].lower() in ("0x", "0o", "0b") else 10)
        except ValueError:
            return None
    return None if value.kind == "other" else (value.kind, spelled)


def contradiction(problem: str, tests: str) -> str | None:
    """Why no answer can pass the tests when two of them expect different results of the same call (literal
    arguments and results, MultiPL-E's `(assert ((candidate ARGS) = EXPECTED))`), else None. The fault is
    the tests' own: MultiPL-E's translator can render two different Python calls alike (`f(3, 4, 7)` and
    `f(3.0, 4, 7)` both as `candidate 3.0 4.0 7.0` where the parameters are floats)."""
    sig = signature(problem)
    if sig is None:
        return None
    seen: dict[tuple, tuple[int, object, str]] = {}  # call -> (line, result, result as written)
    for args, expected in function_calls(tests, sig):
        call = tuple(canonical(arg, tests) for arg in args)
        result = canonical(expected, tests) if expected else None
        if expected is None or result is None or None in call or all(a.kind == "unit" for a in args):
            continue
        line, shown = tests.count("\n", 0, expected.start) + 1, tests[expected.start : expected.end]
        earlier_line, earlier_result, earlier_shown = seen.setdefault(call, (line, result, shown))
        if earlier_result != result:
            arguments = tests[args[0].start : args[-1].end]
            return (
                f"the tests contradict each other: lines {earlier_line} and {line} expect `{earlier_shown}` "
                f"and `{shown}` of the same call with `{arguments}`, so no answer passes them all (a fault "
                "of the tests themselves, not a rendering bug REPAIR_PROBLEMS repairs)"
            )
    return None


def _verdicts(
    jobs: Sequence[tuple[Job, Job | None]], prompts: Sequence[str], pool: SandboxPool
) -> list[tuple[str | None, bool]]:
    """(error or None, whether the verdict is definite) per problem; every job is submitted before any
    result is awaited, so the workers stay busy."""
    futures = [(pool.submit(stub), pool.submit(ref) if ref else None) for stub, ref in jobs]
    results = []
    for (stub_program, _), prompt, (stub, reference) in zip(jobs, prompts, futures, strict=True):
        outcome = stub.result()
        error, definite = stub_error(outcome, stub_program.tests, prompt), is_definite(outcome)
        if error is None:  # tests that compile but contradict each other fail every answer, a reference's too
            error = contradiction(prompt, stub_program.tests)
        if error is None and reference is not None:
            outcome = reference.result()
            error, definite = reference_error(outcome), is_definite(outcome)
        results.append((error, definite))
    return results


def leave_out_broken(
    problems: list[dict],
    cfg: CheckSettings,
    assemble: Assemble,
    note: Callable[[str], None] = print,
    *,
    solutions: bool = True,
    what: str | None = None,
) -> tuple[list[dict], CheckResult]:
    """The usable problems (their tests repaired first under REPAIR_PROBLEMS=1, each repair named), each
    broken one named through `note` with its error, then the count: what a run does on load. Without
    `solutions` (SFT: the solution is what it trains on, and the demo's SFT set holds wrong ones on purpose)
    only the tests are checked. `what` names the set in the count's line (the setting it came from), for a run
    that checks more than one."""
    if cfg.repair_problems:
        problems, _ = repair_problems(problems, note)
    # SFT may read rows without tests: nothing to check there, the reference answer is all it uses.
    checked = [p if solutions else {**p, "solution": None} for p in problems if p["tests"].strip()]
    result = check_problems(checked, cfg, assemble)
    for problem_id, error in result.broken:
        note(f"left out problem {problem_id}: {error}")
    untested = len(problems) - result.total
    also = f"; {untested} without tests, not checked" if untested else ""
    label = f" ({what})" if what else ""
    note(
        f"problem check{label}: {result.summary()}{also} ({result.cached} verdicts cached, "
        f"{result.seconds:.1f} s)"
    )
    broken = {problem_id for problem_id, _ in result.broken}
    return [p for p in problems if str(p["id"]) not in broken], result


def check_source(source: str, cfg: CheckSettings, assemble: Assemble) -> int:
    """`python rewards.py check PROBLEMS`: one line per broken problem (a malformed row too) with its first
    error line, then `N of M problems usable`; 0 when all are, else 1. A local file is read without the
    datasets library; anything else (a hub id, with :CONFIG[:SPLIT]) through problems.load_problems."""
    malformed: list[str] = []
    path = Path(source).expanduser()
    if path.is_file():
        problems = usable_problems(load_rows(path), malformed.append)
    else:
        problems = load_problems(source, malformed.append, setting_name="PROBLEMS")
    if cfg.repair_problems:
        problems, _ = repair_problems(problems, lambda text: print(text, file=sys.stderr))
    result = check_problems(problems, cfg, assemble)
    for line in malformed:
        print(line.removeprefix("skipped problem "))
    for problem_id, error in result.broken:
        print(f"{problem_id}: {error}")
    total = result.total + len(malformed)
    print(f"{result.usable} of {total} problems usable", flush=True)
    return 0 if result.usable == total else 1
