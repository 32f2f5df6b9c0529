"""The problem check against the real compiler: broken problems named with the compiler's first error line,
usable ones kept, verdicts cached by content."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from problem_check import cache_path, check_problems, leave_out_broken
from problems import BUNDLED_PROBLEMS, load_problems
from rewards import RewardConfig, reference_program

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "(** The sum of the list. *)\nlet total (xs : int list) : int ="
TESTS = "let () =\n  assert (total [] = 0);\n  assert (total [1; 2; 3] = 6);\n;;"
SOLUTION = "\n  List.fold_left ( + ) 0 xs"
CFG = RewardConfig(reward_workers=2)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Every test reads and writes a cache of its own, never the user's."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def problem(problem_id: str, **fields) -> dict:
    return {"id": problem_id, "problem": PROMPT, "tests": TESTS, "solution": SOLUTION, **fields}


def test_bundled_problem_sets_are_all_usable():
    problems = load_problems(str(ROOT / "data" / "problems.jsonl"))
    problems += load_problems(str(ROOT / "data" / "heldout.jsonl"))
    result = check_problems(problems, CFG, reference_program)
    assert result.broken == []
    assert result.summary() == f"{len(problems)} of {len(problems)} problems usable"


def test_each_kind_of_broken_problem_is_named_with_the_first_error_line():
    problems = [
        problem("good"),
        problem("no_solution", solution=None),
        problem("tilde", tests="let () =\n  assert (total [(~5); 5] = 0);\n;;"),
        problem("wrong_type", tests='let () =\n  assert (total [1] = "1");\n;;'),
        problem("no_asserts", tests="let () = print_string (string_of_int (total [1]))"),
        problem("wrong_solution", solution="\n  List.length xs"),
        problem("solution_not_ocaml", solution="\n  List.fold_left ( + ) 0 xs in"),
        problem("unknown_type", problem="(** Bad. *)\nlet total (xs : item list) : int ="),
    ]
    broken = dict(check_problems(problems, CFG, reference_program).broken)
    assert list(broken) == [
        "tilde",
        "wrong_type",
        "no_asserts",
        "wrong_solution",
        "solution_not_ocaml",
        "unknown_type",
    ]
    assert broken["tilde"].startswith("the tests do not compile against the signature: Syntax error")
    assert "tests line 2: `(~5)`" in broken["tilde"] and "REPAIR_PROBLEMS=1" in broken["tilde"]
    assert (
        "line 2: This expression has type string but an expression was expected of type int"
        in (broken["wrong_type"])
    )
    assert "hold no `assert`" in broken["no_asserts"]
    assert broken["wrong_solution"].startswith("the reference solution passes 1 of 2 tests")
    assert broken["solution_not_ocaml"].startswith("the reference solution does not compile with the tests")
    assert "Unbound type constructor item" in broken["unknown_type"]
    assert all("\n" not in error for error in broken.values())


def test_verdicts_are_cached_by_content(tmp_path):
    problems = [problem("good"), problem("tilde", tests="let () =\n  assert (total [(~5)] = 0);\n;;")]
    cold = check_problems(problems, CFG, reference_program)
    assert (cold.cached, len(cold.broken)) == (0, 1)
    assert cache_path() == tmp_path / "cache" / "ocaml-grpo" / "problem-check.jsonl"
    assert len(cache_path().read_text().splitlines()) == 2

    warm = check_problems(problems, CFG, reference_program)
    assert (warm.cached, warm.broken) == (2, cold.broken)

    # A torn last line (a run killed mid-write) is ignored; the fixed tests are new content, checked afresh.
    with cache_path().open("a") as f:
        f.write('{"key": "abc')
    problems[1]["tests"] = "let () =\n  assert (total [-5] = -5);\n;;"
    fixed = check_problems(problems, CFG, reference_program)
    assert (fixed.cached, fixed.broken) == (1, [])
    # The same problem under another id is the same content: its verdict is reused.
    again = check_problems([{**problems[1], "id": "renamed"}], CFG, reference_program)
    assert (again.cached, again.broken) == (1, [])


def test_an_unwritable_cache_costs_the_cache_only(tmp_path, monkeypatch):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    result = check_problems(
        [problem("good"), problem("wrong_solution", solution="\n  0")], CFG, reference_program
    )
    assert [problem_id for problem_id, _ in result.broken] == ["wrong_solution"]


def test_leave_out_broken_keeps_usable_problems_and_names_the_others():
    notes = []
    problems = [
        problem("good"),
        problem("wrong_solution", solution="\n  0"),
        problem("also_good", solution=None),
    ]
    kept, result = leave_out_broken(problems, CFG, reference_program, notes.append)
    assert [p["id"] for p in kept] == ["good", "also_good"]
    assert result.usable == 2
    assert notes[0].startswith("left out problem wrong_solution: the reference solution passes 1 of 2 tests")
    assert notes[1].startswith("problem check: 2 of 3 problems usable (0 verdicts cached")
    assert json.loads(cache_path().read_text().splitlines()[0])["error"] is None

    # SFT trains on the solutions (the demo's SFT set holds wrong ones on purpose): only tests are checked.
    problems.append(problem("tilde", tests="let () =\n  assert (total [(~5)] = 0);\n;;"))
    kept, result = leave_out_broken(problems, CFG, reference_program, notes.append, solutions=False)
    assert [p["id"] for p in kept] == ["good", "wrong_solution", "also_good"]
    assert kept[1]["solution"] == "\n  0"


def test_rewards_check_cli_lists_broken_problems_and_exits_1(tmp_path, run_python):
    rows = [
        {"id": "good", "prompt": PROMPT, "tests": TESTS, "solution": SOLUTION},
        {"id": "wrong_solution", "prompt": PROMPT, "tests": TESTS, "solution": "\n  0"},
        {"id": "no_tests", "prompt": PROMPT},
    ]
    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code = "import sys, rewards; c = rewards.main(sys.argv[1:]); assert 'torch' not in sys.modules; exit(c)"
    run = run_python("-c", code, "check", str(path), timeout=120)
    assert run.returncode == 1, run.stderr
    assert run.stdout.splitlines() == [
        "no_tests: no tests",
        "wrong_solution: the reference solution passes 1 of 2 tests (exit 0)",
        "1 of 3 problems usable",
    ]
    path.write_text(json.dumps(rows[0]) + "\n")
    run = run_python("rewards.py", "check", str(path), timeout=120)
    assert (run.returncode, run.stdout) == (0, "1 of 1 problems usable\n")


def test_training_leaves_broken_problems_out_and_says_so(tmp_path, tiny_model, one_torch_thread):
    from train import main

    rows = [json.loads(line) for line in BUNDLED_PROBLEMS.read_text().splitlines()]
    broken = {**rows[0], "id": "broken_row", "tests": rows[0]["tests"].replace("= 2);", "= (~2));", 1)}
    data = tmp_path / "problems.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in [broken, *rows]))
    out = tmp_path / "run"
    settings = [
        *("--model-id", str(tiny_model), "--training-dataset", str(data), "--output-dir", str(out)),
        *("--batch-size", "2", "--num-generations", "2", "--max-completion", "8", "--max-steps", "1"),
        *("--lora-r", "4", "--lora-alpha", "8", "--eval-steps", "none", "--report-to", "none"),
    ]
    assert main(settings, environ={}) == 0
    log = (out / "learning.log").read_text()
    header = log.split("\n[Epoch", 1)[0]
    assert (
        "# left out problem broken_row: the tests do not compile against the signature: Syntax error"
        in header
    )
    assert f"# problem check (TRAINING_DATASET): {len(rows)} of {len(rows) + 1} problems usable" in header
    prompts = [json.loads(line)["problem_id"] for line in (out / "reward_logs" / "completions.jsonl").open()]
    assert prompts and "broken_row" not in prompts
