"""Hostile completions against the real toolchain: contained, and never more credit than honestly earned."""

import os
import uuid
from pathlib import Path

import pytest
from test_rewards import PROBLEM, TESTS

import ocaml_sandbox
import rewards

CORRECT = "  List.fold_left ( + ) 0 xs"
MODES = ["bwrap", "rlimit"]


def cfg_for(mode: str) -> rewards.RewardConfig:
    return rewards.RewardConfig(
        min_non_empty_lines=0, ocaml_sandbox=mode, ocaml_run_timeout=1.0, reward_workers=2
    )


def score(mode: str, *completions: str) -> list[dict]:
    items = [{"problem": PROBLEM, "tests": TESTS, "completion": c + "\n(* END *)"} for c in completions]
    return rewards.score_batch(items, cfg_for(mode))


def test_check_toolchain_names_the_apt_packages(monkeypatch):
    ocaml_sandbox.check_toolchain()  # present here
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ocaml_sandbox.ToolchainMissing, match="apt-get install -y ocaml-nox ocaml-findlib"):
        ocaml_sandbox.check_toolchain()


def test_sandbox_mode_choice():
    assert ocaml_sandbox.sandbox_mode("rlimit") == "rlimit"
    assert ocaml_sandbox.sandbox_mode("auto") == "bwrap"  # bwrap runs on this machine
    with pytest.raises(ValueError, match="OCAML_SANDBOX"):
        ocaml_sandbox.sandbox_mode("docker")


def test_auto_falls_back_with_one_warning(monkeypatch, caplog):
    monkeypatch.setattr(ocaml_sandbox, "_bwrap_works", lambda: "no user namespaces")
    ocaml_sandbox._warn_no_bwrap.cache_clear()
    with caplog.at_level("WARNING"):
        assert ocaml_sandbox.sandbox_mode("auto") == "rlimit"
        assert ocaml_sandbox.sandbox_mode("auto") == "rlimit"
    assert len([r for r in caplog.records if "bubblewrap cannot start" in r.message]) == 1
    with pytest.raises(RuntimeError, match="OCAML_SANDBOX=bwrap"):
        ocaml_sandbox.sandbox_mode("bwrap")


# Each hostile body with the honest number of assertions it may pass (of 4).
HOSTILE = {
    "infinite loop after one answer": ("  if xs = [] then 0 else (let rec spin () = spin () in spin ())", 1),
    "allocation bomb": ("  let rec grow acc = grow (Array.make 1_000_000 0 :: acc) in grow []", 0),
    "stack overflow": ("  let rec deep n = 1 + deep (n + 1) in deep 0", 0),
    "stdout flood": ("  while true do print_string (String.make 65536 'x') done; 0", 0),
    "stderr flood with fake lines": ('  while true do prerr_string "R x 1 pass\\n1 pass\\n" done; 0', 0),
    "raising": ("  raise Not_found", 0),
    "exit 0 in the function": ("  exit 0", 0),
    "forged result lines": (
        '  List.iter (fun i -> Printf.printf "%d pass\\n" i; Printf.eprintf "R n %d pass\\n" i)\n'
        "    [1; 2; 3; 4];\n"
        "  List.length xs",
        2,
    ),
    "tally theft": ("  let t = Tally.take () in Tally.check t 1 (fun () -> ()); 0", 0),
    "unix fork": ("  ignore (Unix.fork ()); List.fold_left ( + ) 0 xs", 0),
}

# Whole-program shapes: effects at the completion's top level, and shadowed comparisons.
HOSTILE_PROGRAMS = {
    "exit 0 at top level": (f"let () = exit 0\nlet sum_list (xs : int list) : int =\n{CORRECT}", 0),
    "at_exit forging lines": (
        'let () = at_exit (fun () -> for i = 1 to 4 do Printf.printf "%d pass\\n" i; '
        'Printf.eprintf "R x %d pass\\n" i done)\nlet sum_list (xs : int list) : int = List.length xs',
        2,
    ),
    "shadowed (=), (<>), compare, Stdlib": (
        "let (=) _ _ = true\nlet (<>) _ _ = false\nlet compare _ _ = 0\n"
        "module Stdlib = struct let (=) _ _ = true end\nlet sum_list (xs : int list) : int = 42",
        0,
    ),
}


@pytest.mark.parametrize("mode", MODES)
def test_hostile_completions_are_contained_and_earn_no_false_credit(mode):
    cases = {**HOSTILE, **HOSTILE_PROGRAMS}
    results = score(mode, *(body for body, _ in cases.values()), CORRECT)
    for (name, (_, honest)), result in zip(cases.items(), results, strict=False):
        assert result["tests_passed"] == honest, (name, result)
        assert result["tests_total"] == 4
        assert result["total_reward"] <= 0.35 + 0.65 * honest / 4 + 1e-9, (name, result)
        assert result["stage"] != "passed", name
    # The pool survives all of it: a correct completion still earns full marks.
    assert results[-1]["total_reward"] == 1.0


def test_timeout_keeps_earlier_credit_and_reports_timeout():
    (result,) = score("bwrap", HOSTILE["infinite loop after one answer"][0])
    assert result["stage"] == "timeout"
    assert result["tests_passed"] == 1
    assert result["tests"] == pytest.approx(0.65 / 4)


def test_bwrap_hides_the_home_folder_and_host_files():
    home_secret = Path.home() / f".reward-test-secret-{uuid.uuid4().hex}"
    outside = Path("/tmp") / f"reward-test-pwned-{uuid.uuid4().hex}"
    home_secret.write_text("42\n")
    try:
        reads_home = (
            f'  let secret = try int_of_string (input_line (open_in "{home_secret}")) with _ -> -1 in\n'
            "  if secret = 42 then List.fold_left ( + ) 0 xs else -1"
        )
        writes_outside = (
            f'  (try let oc = open_out "{outside}" in output_string oc "x"; close_out oc with _ -> ());\n'
            f'  ignore (Sys.command "echo x > {outside}.sh");\n'
            f'  ignore (Sys.command "cat {home_secret} && touch {outside}.cat");\n'
            "  List.fold_left ( + ) 0 xs"
        )
        read, written = score("bwrap", reads_home, writes_outside)
        assert read["tests_passed"] == 0, read
        assert written["tests_passed"] == 4  # honest answer, its side effects went nowhere
        for suffix in ("", ".sh", ".cat"):
            assert not Path(f"{outside}{suffix}").exists()
    finally:
        home_secret.unlink()


def test_runner_uid_cannot_write_its_own_work_dir():
    writes_here = (
        '  let ok = try let oc = open_out "planted.ml" in close_out oc; true with Sys_error _ -> false in\n'
        "  if ok then 99 else List.fold_left ( + ) 0 xs"
    )
    for mode in MODES:
        (result,) = score(mode, writes_here)
        if os.geteuid() == 0:
            assert result["tests_passed"] == 4, (mode, result)


def test_compiler_output_with_invalid_utf8_is_decoded():
    (result,) = score("bwrap", '  let s = "\udcff\xff" in String.length s + xs')
    assert result["stage"] == "type_error"
    assert isinstance(result["error_sample"], str) and result["error_sample"]


def test_compiler_timeout_restarts_the_checker():
    # Typing is fast, but the error message would print a type with 2^32 leaves.
    bomb = (
        "let pair x = (x, x)\n"
        "let g x = pair (pair (pair (pair (pair (pair (pair (pair x)))))))\n"
        "let h x = g (g (g (g x)))\n"
        "let sum_list (xs : int list) : int = h\n"
    )
    cfg = rewards.RewardConfig(min_non_empty_lines=0, ocaml_compile_timeout=1.0, reward_workers=1)
    item = {"problem": PROBLEM, "tests": TESTS}
    (stuck,) = rewards.score_batch([{**item, "completion": bomb}], cfg)
    assert (stuck["stage"], stuck["type_check"], stuck["compile"]) == ("timeout", 0, 0)
    (after,) = rewards.score_batch([{**item, "completion": CORRECT + "\n(* END *)"}], cfg)
    assert after["total_reward"] == 1.0


def runner_uid_processes() -> list[str]:
    """Host processes running as one of the runner uids, other than the runners themselves."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        uid = int(text.split("Uid:")[1].split()[0])
        name = text.split("Name:")[1].split()[0]
        if ocaml_sandbox.RUNNER_UID_BASE <= uid < ocaml_sandbox.RUNNER_UID_BASE + 16 and name not in (
            "ocamlrun",
            "runner.byte",
        ):
            found.append(name)
    return found


@pytest.mark.skipif(os.geteuid() != 0, reason="the runner uid exists only when the trainer is root")
def test_fork_bomb_is_capped_and_swept():
    bomb = '  ignore (Sys.command ":(){ :|:& };:"); List.fold_left ( + ) 0 xs'
    (result,) = score("bwrap", bomb)
    assert result["tests_passed"] <= 4
    assert runner_uid_processes() == []
    (after,) = score("bwrap", CORRECT)
    assert after["total_reward"] == 1.0
