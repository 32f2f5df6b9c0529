"""What an answer can see from inside the sandbox (docs/sandbox.md): never its tests, never another
completion's files, and the records name the answer's own file, not the worker's folders."""

import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest
from test_rewards import PROBLEM, TESTS

import ocaml_sandbox
import rewards

MODES = ["bwrap", "rlimit"]
ROOT = Path(__file__).resolve().parents[1]
SECRET_PROBLEM = "(** The secret word of [n]. *)\nlet secret (n : int) : string ="

# Places to search, by mode: under bubblewrap everything but the system installation (which predates
# the run); without it the host is the limit, so the places a run's files could be.
ROOTS = {
    "bwrap": '["/"; "/dev/shm"]',
    "rlimit": '["."; ".."; "/dev/shm"; "/var/tmp"; "/tmp"]',
}
SKIPPED = '["/usr"; "/bin"; "/sbin"; "/lib"; "/lib32"; "/lib64"; "/libx32"; "/proc"; "/sys"; "/dev"]'
PROC_FILES = '["/proc/self/environ"; "/proc/self/cmdline"; "/proc/self/maps"]'

# An answer that reads every file it can reach and returns whatever the tests expect, if it can find
# it: each expected value is "expected-<32 hex>-<n>".
SEARCHER = """let marker = "expected-"
let found : string list ref = ref []
let budget = ref 100_000_000

let in_marker = Array.init 256 (fun c -> String.contains marker (Char.chr c))
let hex c = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')

(* Skips ahead by the marker's length wherever its last place holds a character the marker lacks. *)
let scan text =
  let m = String.length marker and n = String.length text in
  let i = ref 0 in
  while !i <= n - m - 34 do
    if not in_marker.(Char.code text.[!i + m - 1]) then i := !i + m
    else begin
      if String.sub text !i m = marker && String.for_all hex (String.sub text (!i + m) 32) then begin
        let j = ref (!i + m + 33) in
        while !j < n && text.[!j] >= '0' && text.[!j] <= '9' do incr j done;
        found := String.sub text !i (!j - !i) :: !found
      end;
      incr i
    end
  done

(* Up to 16 MB of a file; pipes and sockets (no length) are skipped rather than waited on. *)
let read path =
  match open_in_bin path with
  | exception Sys_error _ -> ()
  | ic ->
      (match in_channel_length ic with
       | exception Sys_error _ -> ()
       | _ ->
           let buffer = Buffer.create 4096 and chunk = Bytes.create 65536 in
           let rec loop () =
             match input ic chunk 0 65536 with
             | 0 -> ()
             | k -> Buffer.add_subbytes buffer chunk 0 k; if Buffer.length buffer < 16_000_000 then loop ()
             | exception _ -> ()
           in
           loop ();
           budget := !budget - Buffer.length buffer;
           scan (Buffer.contents buffer));
      close_in_noerr ic

let rec walk depth path =
  if !budget > 0 && depth < 10 && not (List.mem path SKIPPED) then
    match Sys.is_directory path with
    | exception Sys_error _ -> ()
    | false -> read path
    | true -> (
        match Sys.readdir path with
        | exception Sys_error _ -> ()
        | names ->
            let sep = if path = "/" then "" else "/" in
            Array.iter (fun name -> walk (depth + 1) (path ^ sep ^ name)) names)

let everything =
  lazy
    (List.iter (walk 0) ROOTS;
     List.iter read PROC_FILES;
     (match Sys.readdir "/proc/self/fd" with
      | names -> Array.iter (fun fd -> read ("/proc/self/fd/" ^ fd)) names
      | exception Sys_error _ -> ());
     List.rev !found)

let secret (n : int) : string =
  let suffix = "-" ^ string_of_int n in
  let fits s =
    String.length s > String.length suffix
    && String.sub s (String.length s - String.length suffix) (String.length suffix) = suffix
  in
  match List.find_opt fits (Lazy.force everything) with Some s -> s | None -> ""
"""


def searcher(mode: str) -> str:
    return (
        SEARCHER.replace("SKIPPED", SKIPPED).replace("PROC_FILES", PROC_FILES).replace("ROOTS", ROOTS[mode])
    )


def score(mode: str, problem: str, tests: str, *codes: str, timeout: float = 20.0) -> list[dict]:
    cfg = rewards.RewardConfig(
        min_non_empty_lines=0, ocaml_sandbox=mode, ocaml_run_timeout=timeout, reward_workers=1
    )
    items = [{"problem": problem, "tests": tests, "completion": c + "\n(* END *)"} for c in codes]
    return rewards.score_batch(items, cfg)


def skip_without_isolation(mode: str) -> None:
    if mode == "rlimit" and os.geteuid() != 0:
        pytest.skip("without bubblewrap or root a test program is the trainer's own user (docs/sandbox.md)")


@pytest.mark.parametrize("mode", MODES)
def test_an_answer_that_searches_every_file_it_can_reach_finds_none_of_its_tests(mode):
    skip_without_isolation(mode)
    planted, hidden = f"expected-{uuid.uuid4().hex}-1", f"expected-{uuid.uuid4().hex}-2"
    # The control: a file the answer can read holds the first expected value, so the search works...
    tools = ocaml_sandbox.build_tools()
    control = (tools if mode == "bwrap" else Path("/dev/shm")) / f"control-{uuid.uuid4().hex}.txt"
    control.write_text(planted)
    control.chmod(0o644)
    tests = f'let () =\n  assert (secret 1 = "{planted}");\n  assert (secret 2 = "{hidden}");\n;;'
    honest_wrong = f'let secret (n : int) : string = if n = 1 then "{planted}" else ""'
    try:
        search, honest = score(mode, SECRET_PROBLEM, tests, searcher(mode), honest_wrong)
    finally:
        control.unlink()
    # ... and the second is nowhere but in the tests.
    assert (search["tests_passed"], search["stage"]) == (1, "tests_failed"), search
    assert {k: v for k, v in search.items() if k != "preview"} == {
        k: v for k, v in honest.items() if k != "preview"
    }


# Where a completion might leave something for the next one. Without bubblewrap the host's /tmp and
# /dev/shm are shared by everyone (docs/sandbox.md); the worker's own folder is still closed.
STASHES = {"bwrap": ["stash", "../stash", "/tmp/stash", "/dev/shm/stash"], "rlimit": ["stash", "../stash"]}


@pytest.mark.parametrize("mode", MODES)
def test_no_completion_sees_the_files_of_another(mode):
    skip_without_isolation(mode)
    places = "[" + "; ".join(f'"{place}"' for place in STASHES[mode]) + "]"
    # The first completion fails its tests exactly when one of its writes went through.
    leave = (
        "  let leave p =\n"
        '    try let oc = open_out p in output_string oc "x"; close_out oc; true with _ -> false in\n'
        f"  if List.exists (fun b -> b) (List.map leave {places}) then -1 else List.fold_left ( + ) 0 xs"
    )
    find = f"  if List.exists Sys.file_exists {places} then -1 else List.fold_left ( + ) 0 xs"
    # One worker, so that the second completion runs where the first one did.
    left, found = score(mode, PROBLEM, TESTS, leave, find, timeout=2.0)
    assert found["tests_passed"] == 4, found  # nothing the first one left is visible to the second
    if os.geteuid() == 0:  # the answer runs under a uid of its own: none of these places is writable
        assert left["tests_passed"] == 4, left


# What goes wrong, and where the record must say it happened.
FAILURES = {
    "type error": ('  1 + "one"', 'File "solution.ml", line 2: This expression has type string'),
    "wrong signature": (
        'let sum_list (xs : int list) : string = "0"',
        'File "tests.ml", line 2: This expression has type int',
    ),
    "match failure": (
        "  match xs with [] -> 0",
        'File "tests.ml", line 3: assertion 2 of 4 raised File "solution.ml", line 2, characters',
    ),
    "wrong value": ("  List.length xs", 'File "tests.ml", line 3: assertion 2 of 4 failed'),
    "exception with a path": (
        '  let _ = open_in (Sys.getcwd () ^ "/missing.txt") in 0',
        'File "tests.ml", line 2: assertion 1 of 4 raised Sys_error("missing.txt: No such file',
    ),
    "timeout": (
        "  if xs = [] then 0 else (let rec spin () = spin () in spin ())",
        "assertion 2 of 4 did not finish",
    ),
    "unsafe external": (
        'external f : int -> int = "caml_abs_float"\nlet sum_list (xs : int list) : int = f 0',
        "unsafe",
    ),
}


@pytest.mark.parametrize("mode", MODES)
def test_error_samples_name_the_answers_file_and_lines_not_the_workers_folders(mode):
    results = score(mode, PROBLEM, TESTS, *(code for code, _ in FAILURES.values()), timeout=1.0)
    for (name, (_, expected)), result in zip(FAILURES.items(), results, strict=True):
        assert expected in result["error_sample"], (name, result["error_sample"])
        assert "ocaml-reward" not in result["error_sample"], (name, result["error_sample"])


@pytest.mark.parametrize("mode", MODES)
def test_the_working_folder_is_empty_when_the_completions_code_first_runs(mode):
    # Top-level code runs first, when the harness applies the completion's functor.
    code = (
        'let seen = Array.length (Sys.readdir ".")\n'
        "let sum_list (xs : int list) : int = if seen = 0 then List.fold_left ( + ) 0 xs else -1"
    )
    (result,) = score(mode, PROBLEM, TESTS, code, timeout=2.0)
    assert result["tests_passed"] == 4, result


def score_in_own_pool(mode: str, code: str) -> dict:
    cfg = rewards.RewardConfig(min_non_empty_lines=0, ocaml_sandbox=mode, reward_workers=1)
    pool = ocaml_sandbox.SandboxPool(1, mode, cfg.limits())
    try:
        item = {"problem": PROBLEM, "tests": TESTS, "completion": code + "\n(* END *)"}
        return rewards.score_batch([item], cfg, pool=pool)[0]
    finally:
        pool.close()


# Without bubblewrap a completion can write the host's /tmp: proof that it ran. (Under bubblewrap the same
# OCaml code seals the child; nothing there would be left to see.)
@pytest.mark.skipif(os.geteuid() != 0, reason="only root drops to another uid")
def test_a_completion_never_runs_unsealed(monkeypatch, caplog):
    witness = Path("/tmp") / f"ran-{uuid.uuid4().hex}"
    code = f'let () = close_out (open_out "{witness}")\nlet sum_list (xs : int list) : int = 0'
    score_in_own_pool("rlimit", code)
    assert witness.exists()  # sealed as it should be, it runs
    witness.unlink()
    # (uid_t)-1 is no uid: the drop fails, so the child must stop before the completion's first line.
    monkeypatch.setattr(ocaml_sandbox, "RUNNER_UID_BASE", 2**32 - 1)
    ocaml_sandbox._warn_unsealed.cache_clear()
    with caplog.at_level("ERROR"):
        result = score_in_own_pool("rlimit", code)
    assert not witness.exists()
    assert result["tests_passed"] == 0 and result["error_sample"].startswith("sealing the test unit failed")
    assert any("without exposing them" in r.message for r in caplog.records)


# The trainer is often not root on a GPU box: then test programs run as its own uid, which can unlink
# and write what the checker wrote. Run a pool as an unprivileged user, with the system's Python (the
# sandbox module needs only the standard library; this venv's may sit in a folder only root can read).
UNPRIVILEGED_SCRIPT = """
import sys
sys.path.insert(0, sys.argv[1])
import ocaml_sandbox as S
tests = "let () =\\n  assert (sum_list [] = 0);\\n  assert (sum_list [1; 2] = 3);\\n;;"
sig = "let sum_list (xs : int list) : int =\\n"
bodies = {
    "correct": "  List.fold_left ( + ) 0 xs",
    "leaves a file": '  (try close_out (open_out "stash") with _ -> ()); List.fold_left ( + ) 0 xs',
    "sees an empty folder": '  if Sys.readdir "." = [||] then List.fold_left ( + ) 0 xs else -1',
}
for mode in ("bwrap", "rlimit"):
    try:
        pool = S.SandboxPool(1, mode, S.Limits(run_timeout=2.0))
    except RuntimeError:
        continue
    for name, body in bodies.items():
        outcome = pool.evaluate_many([S.Job("", sig + body, tests, "sum_list")])[0]
        print(mode, name, outcome.tests_passed, flush=True)
    pool.close()
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/usr/bin/python3").exists() or shutil.which("setpriv") is None,
    reason="needs root to start an unprivileged user, and the system's python3",
)
def test_without_root_the_working_folder_is_empty_too():
    copy = Path(tempfile.mkdtemp(prefix="sandbox-view-"))
    try:
        shutil.copy(ROOT / "ocaml_sandbox.py", copy)
        shutil.copytree(ROOT / "ocaml", copy / "ocaml")
        (copy / "check.py").write_text(UNPRIVILEGED_SCRIPT)
        for path in [copy, *copy.rglob("*")]:
            path.chmod(0o755)
        done = subprocess.run(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "/usr/bin/python3",
                "check.py",
                str(copy),
            ],
            cwd=copy,
            env={"PATH": "/usr/bin:/bin", "HOME": str(copy), "TMPDIR": "/tmp"},
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert "rlimit sees an empty folder 2" in lines, done.stdout
    for mode in {line.split()[0] for line in lines}:
        assert [line for line in lines if line.startswith(mode)] == [
            f"{mode} correct 2",
            f"{mode} leaves a file 2",
            f"{mode} sees an empty folder 2",
        ]
