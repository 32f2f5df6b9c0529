"""The syntax-aware reward with the real compiler: shapes, stages, penalties, curriculum, logs, CLI."""

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import envflags
import rewards
from problems import unescape_line_breaks
from rewards import END_MARKER, RewardConfig, SyntaxAwareReward, score_batch, score_completion

ROOT = Path(__file__).resolve().parents[1]
PROBLEMS = [json.loads(line) for line in (ROOT / "data" / "problems.jsonl").read_text().splitlines() if line]
HELDOUT = [json.loads(line) for line in (ROOT / "data" / "heldout.jsonl").read_text().splitlines() if line]
NO_GATE = RewardConfig(min_non_empty_lines=0)

PROBLEM = "(** Sum the integers of [xs]. *)\nlet sum_list (xs : int list) : int ="
TESTS = """let () =
  assert (sum_list [] = 0);
  assert (sum_list [1; 2] = 3);
  assert (sum_list [5] = 5);
  assert (sum_list [1; 1; 1] = 3);
;;"""


def signature(problem: dict) -> str:
    return rewards.parse_problem(problem["prompt"]).signature


def indented(code: str, indent: str) -> str:
    return "\n".join(indent + line if line.strip() else line for line in code.split("\n"))


def shapes(problem: dict) -> dict[str, str]:
    """The ways a model writes a correct answer down."""
    body, sig, prompt = problem["solution"], signature(problem), problem["prompt"]
    plain_let = sig.replace("let rec ", "let ", 1)
    call = f"# {problem['id']} ;;"  # a toplevel session: a syntax error if it were read as the answer
    return {
        "body, END after": f"{body}\n{END_MARKER}",
        "body in fence, END inside": f"```ocaml\n{body}\n{END_MARKER}\n```",
        "body in untagged fence, END after": f"```\n{body}\n```\n{END_MARKER}\n",
        "prose, signature repeated in fence": f"Here it is:\n\n```ocaml\n{sig}{body}\n{END_MARKER}\n```",
        "whole prompt repeated (types too)": f"```ocaml\n{prompt}{body}\n```\n{END_MARKER}",
        "signature with plain let": f"{plain_let}{body}\n{END_MARKER}",
        "prose, no fence": f"Here is the solution:\n{body}\n{END_MARKER}",
        "list item, indented fence, comment first": "1. The function:\n\n"
        + indented(f"```ocaml\n(* {problem['id']} *)\n{sig}{body}\n{END_MARKER}\n```", "   "),
        "tab-indented fence, helper first": "```ocaml\n"
        + indented(f"let unused_helper x = x\n\n{sig}{body}", "\t")
        + f"\n```\n{END_MARKER}",
        "```ml tag, Windows line ends": f"```ml\n{sig}{body}\n{END_MARKER}\n```".replace("\n", "\r\n"),
        "usage block first, fence closed on the last code line": f"```ocaml\n{call}\n```\n\n```OCaml\n"
        + f"{sig}{body}```\n{END_MARKER}",
    }


def test_reference_solutions_earn_full_marks_in_every_shape():
    items = [
        {"problem": p["prompt"], "tests": p["tests"], "completion": text, "problem_id": f"{p['id']}: {shape}"}
        for p in PROBLEMS
        for shape, text in shapes(p).items()
    ]
    results = score_batch(items, NO_GATE)
    wrong = [
        (r["problem_id"], r["stage"], r["reason"], r["error_sample"])
        for r in results
        if r["total_reward"] != 1
    ]
    assert not wrong
    assert len(results) == 11 * len(PROBLEMS) >= 11 * 40


def test_problem_types_are_kept_and_repeated_ones_dropped():
    tree = next(p for p in PROBLEMS if "type " in p["prompt"])
    parsed = rewards.parse_problem(tree["prompt"])
    solution = rewards.assemble_solution(
        parsed, rewards.extract_code(shapes(tree)["whole prompt repeated (types too)"], parsed.function)
    )
    assert "type " not in rewards.strip_comments(solution)
    assert parsed.type_names and all(f"type {name}" in parsed.types for name in parsed.type_names)


def test_extract_code_drops_prose_but_not_code():
    assert (
        rewards.extract_code("Sure! Here is the code:\n\n  Some (f x y)\n(* END *)\nHope it helps.", "f")
        == "Some (f x y)"
    )
    assert rewards.extract_code("Some (f x y)", "f") == "Some (f x y)"
    assert rewards.extract_code("Intro.\n```ocaml\nlet x = 1\n(* END *)\n```\nMore text", "f") == "let x = 1"
    assert rewards.extract_code("```\nlet x = 1\n", "f") == "let x = 1"  # an unclosed fence runs to the end
    assert rewards.ends_with_marker("code\n(* END *)\n```\n  ") and not rewards.ends_with_marker(
        "(* END *) x"
    )


def test_missing_end_marker_loses_only_the_structural_part():
    p = PROBLEMS[0]
    result = score_completion(p["prompt"], p["tests"], p["solution"], cfg=NO_GATE)
    assert result["structural"] == 0 and result["stage"] == "passed"
    assert result["total_reward"] == pytest.approx(0.95)
    middle = score_completion(
        p["prompt"], p["tests"], f"{p['solution']}\n{END_MARKER}\nlet x = 1", cfg=NO_GATE
    )
    assert middle["structural"] == 0


def test_wrong_solution_earns_partial_test_credit():
    # List.length agrees with the sum on [] and [1; 1; 1] only.
    result = score_completion(PROBLEM, TESTS, f"  List.length xs\n{END_MARKER}", cfg=NO_GATE)
    assert (result["tests_passed"], result["tests_total"], result["stage"]) == (2, 4, "tests_failed")
    assert result["total_reward"] == pytest.approx(0.05 + 0.20 + 0.10 + 0.65 * 2 / 4)


def test_stub_earns_no_test_credit_and_is_gated_by_default():
    stub = f'  failwith "TODO"\n{END_MARKER}'
    result = score_completion(PROBLEM, TESTS, stub, cfg=NO_GATE)
    assert (result["stage"], result["tests_passed"]) == ("runtime_error", 0)
    assert result["total_reward"] == pytest.approx(0.35)
    assert "Failure" in result["error_sample"]
    gated = score_completion(PROBLEM, TESTS, stub, cfg=RewardConfig())
    assert (gated["stage"], gated["total_reward"]) == ("gated", 0.0)


ONE_TYPE_ERROR = """let helper (xs : int list) = List.fold_left ( + ) 0 xs
let sum_list (xs : int list) : int = helper xs + "one"
"""
# The broken helper makes sum_list's use of it unbound: that cascade is not counted again.
THREE_TYPE_ERRORS = """let helper (xs : int list) = List.fold_left ( + ) "zero" xs
let sum_list (xs : int list) : int = helper xs
let twice x = x +. 1
let size = List.length 3
"""
SYNTAX_ERROR = "let sum_list (xs : int list) : int =\n  match xs with | [] -> 0 | x :: -> x\n"


def test_error_counts_order_the_rewards():
    texts = [SYNTAX_ERROR, THREE_TYPE_ERRORS, ONE_TYPE_ERROR, "  List.length xs"]
    syntax, three, one, compiled = score_batch(
        [{"problem": PROBLEM, "tests": TESTS, "completion": t + END_MARKER} for t in texts], NO_GATE
    )
    assert (syntax["stage"], syntax["syntax_errors"], syntax["type_check"]) == ("syntax_error", 1, 0)
    assert (three["stage"], three["type_errors"]) == ("type_error", 3)
    assert (one["stage"], one["type_errors"]) == ("type_error", 1)
    assert one["error_sample"].startswith('File "solution.ml", line 2:')
    rewards_in_order = [r["total_reward"] for r in (syntax, three, one, compiled)]
    assert rewards_in_order == sorted(rewards_in_order) and len(set(rewards_in_order)) == 4


def test_solution_that_does_not_fit_the_tests_is_a_compile_error():
    wrong_type = f"let sum_list (xs : int list) : string = string_of_int (List.length xs)\n{END_MARKER}"
    result = score_completion(PROBLEM, TESTS, wrong_type, cfg=NO_GATE)
    assert result["stage"] == "compile_error"
    assert (result["type_check"], result["compile"]) == (pytest.approx(0.2), pytest.approx(0.05))


def test_runaway_penalty():
    body = "  List.length xs"
    truncated = score_completion(PROBLEM, TESTS, body, truncated=True, cfg=NO_GATE)
    honest = score_completion(PROBLEM, TESTS, body, cfg=NO_GATE)
    assert truncated["runaway_penalty_applied"] and not honest["runaway_penalty_applied"]
    assert truncated["total_reward"] == pytest.approx(0.3 * honest["total_reward"])
    ended = score_completion(PROBLEM, TESTS, body + END_MARKER, truncated=True, cfg=NO_GATE)
    assert not ended["runaway_penalty_applied"]


def test_line_gate_counts_code_lines_only():
    short_wrong = f"  (* add them up *)\n\n  List.fold_left ( - ) 0 xs\n{END_MARKER}"
    assert rewards.code_lines(rewards.assemble_solution(rewards.parse_problem(PROBLEM), short_wrong)) == 2
    assert score_completion(PROBLEM, TESTS, short_wrong, cfg=RewardConfig(min_non_empty_lines=3))[
        "stage"
    ] == ("gated")
    ungated = score_completion(PROBLEM, TESTS, short_wrong, cfg=RewardConfig(min_non_empty_lines=2))
    assert (ungated["stage"], ungated["total_reward"]) == ("tests_failed", pytest.approx(0.35 + 0.65 / 4))


HELDOUT_BY_ID = {row["id"]: row for row in HELDOUT}
# Right answers in 1 to 7 lines to three held-out problems, written as the real Qwen2.5-Coder-1.5B wrote its
# passing answers (issue 29: under the seed's gate they scored 0 while a wrong 10-line answer scored more).
SHORT_RIGHT = {
    "is_leap_year": "let is_leap_year (year : int) : bool =\n"
    "  (year mod 4 = 0 && year mod 100 <> 0) || year mod 400 = 0",
    "manhattan_distance": "let manhattan_distance (p : point) (q : point) : int =\n"
    "  abs (p.x - q.x) + abs (p.y - q.y)",
    "coins_value": "let coins_value (coins : coin list) : int =\n"
    "  List.fold_left (fun acc coin ->\n"
    "    acc + (match coin with Penny -> 1 | Nickel -> 5 | Dime -> 10 | Quarter -> 25)) 0 coins",
}
# Short non-answers to the same problems: each passes some tests, type-checks, and would collect the
# structural, type-check and compile credit (0.35 and up) without the gate.
SHORT_NON_ANSWERS = {
    "is_leap_year": "let is_leap_year (year : int) : bool = true",
    "manhattan_distance": "let manhattan_distance (p : point) (q : point) : int = 0",
    "coins_value": 'let coins_value (coins : coin list) : int = failwith "TODO"',
}


def fenced(code: str) -> str:
    return f"```ocaml\n{code}\n{END_MARKER}\n```"


def test_the_line_gate_never_costs_a_right_answer_and_still_zeroes_short_non_answers():
    items = [
        {
            "problem": HELDOUT_BY_ID[pid]["prompt"],
            "tests": HELDOUT_BY_ID[pid]["tests"],
            "completion": fenced(code),
        }
        for answers in (SHORT_RIGHT, SHORT_NON_ANSWERS)
        for pid, code in answers.items()
    ]
    right, wrong = score_batch(items[:3], RewardConfig()), score_batch(items[3:], RewardConfig())
    assert [(r["stage"], r["total_reward"]) for r in right] == [("passed", 1.0)] * 3  # MIN_NON_EMPTY_LINES=8
    assert [(r["stage"], r["total_reward"]) for r in wrong] == [("gated", 0.0)] * 3
    assert all(r["reason"].startswith("1 code lines, fewer than MIN_NON_EMPTY_LINES=8; ") for r in wrong)
    assert wrong[0]["reason"].endswith("4 of 7 tests passed")  # what the toolchain found is kept
    # Without the gate the non-answers collect partial credit: the gate is what stops that.
    assert all(r["total_reward"] >= 0.35 for r in score_batch(items[3:], NO_GATE))


def half_right(reward: SyntaxAwareReward, **kwargs) -> float:
    """The reward, called as TRL calls it, of `  List.length xs` on PROBLEM: no END, half the tests pass."""
    return asyncio.run(reward([None], ["  List.length xs"], problem=[PROBLEM], tests=[TESTS], **kwargs))[0]


@pytest.mark.parametrize("dashboard", [False, True])
def test_the_completion_log_gets_the_rewards_columns_only_for_the_dashboard(dashboard: bool):
    columns: dict[str, list] = {}
    reward = SyntaxAwareReward(RewardConfig(min_non_empty_lines=0), completion_columns=dashboard)
    try:  # TRL's log_extra(column, values) adds a column
        half_right(reward, problem_id=["count"], log_extra=columns.__setitem__)
    finally:
        reward.close()
    if dashboard:
        assert list(columns) == ["problem_id", "stage", "message"]
        assert columns["problem_id"] == ["count"] and columns["stage"] == ["tests_failed"]
    else:
        assert columns == {}


def test_curriculum_weights_follow_the_epoch():
    cfg = RewardConfig(min_non_empty_lines=0, reward_curriculum=True)
    assert cfg.weights_at(0.2) == (0.10, 0.40, 0.30, 0.20)
    assert cfg.weights_at(0.5) == (0.05, 0.25, 0.20, 0.50)
    assert cfg.weights_at(3.0) == (0.05, 0.20, 0.10, 0.65)
    assert RewardConfig().weights_at(0.2) == (0.05, 0.20, 0.10, 0.65)
    reward = SyntaxAwareReward(cfg)
    try:
        by_epoch = [
            half_right(reward, trainer_state=SimpleNamespace(epoch=epoch)) for epoch in (0.1, 0.7, 1.2)
        ]
    finally:
        reward.close()
    # No END, half the tests: structural 0, then type + compile + tests/2 of each phase.
    assert by_epoch == [
        pytest.approx(0.4 + 0.3 + 0.1),
        pytest.approx(0.25 + 0.2 + 0.25),
        pytest.approx(0.625),
    ]


def test_reward_settings_are_checked():
    with pytest.raises(envflags.ConfigError, match="sum to 1"):
        RewardConfig(reward_weight_tests=0.9)
    with pytest.raises(envflags.ConfigError, match="REWARD_CURRICULUM_WEIGHTS"):
        envflags.from_env(RewardConfig, {"REWARD_CURRICULUM_WEIGHTS": "0.5,0.5"})
    with pytest.raises(envflags.ConfigError, match="needs 3 phases"):
        envflags.from_env(
            RewardConfig, {"REWARD_CURRICULUM_BOUNDARIES": "0.5,1.0", "REWARD_CURRICULUM_WEIGHTS": "0,0,0,1"}
        )
    with pytest.raises(envflags.ConfigError, match="OCAML_SANDBOX"):
        envflags.from_env(RewardConfig, {"OCAML_SANDBOX": "docker"})
    assert envflags.from_env(RewardConfig, {"MIN_NON_EMPTY_LINES": "3"}).min_non_empty_lines == 3


def test_trl_callable_scores_plain_and_conversational_completions_and_logs(tmp_path):
    from trl.trainer.utils import is_async_callable

    p = PROBLEMS[0]
    good = f"```ocaml\n{p['solution']}\n{END_MARKER}\n```"
    completions = [
        [{"role": "assistant", "content": good}],
        good,
        "garbage (* not code",
        [{"role": "assistant", "content": p["solution"]}],  # truncated, no END
    ]
    reward = SyntaxAwareReward(NO_GATE, tmp_path / "reward_logs", max_completion_length=8)
    metrics: dict[str, float] = {}
    assert is_async_callable(reward) and reward.__name__ == "syntax_aware_reward"
    try:
        scores = asyncio.run(
            reward(
                prompts=[[{"role": "user", "content": "..."}]] * 4,
                completions=completions,
                completion_ids=[[1] * 5, [1] * 5, [1] * 3, [1] * 8],
                trainer_state=SimpleNamespace(epoch=0.3),
                problem=[p["prompt"]] * 4,
                tests=[p["tests"]] * 4,
                problem_id=[p["id"]] * 4,
                log_metric=lambda name, value: metrics.__setitem__(name, value),
            )
        )
    finally:
        reward.close()
    assert scores[:2] == [1.0, 1.0] and scores[2] < 0.06 and scores[3] == pytest.approx(0.3 * 0.95)
    assert metrics["stages/passed"] == 0.75 and metrics["stages/syntax_error"] == 0.25
    logged = [
        json.loads(line) for line in (tmp_path / "reward_logs" / "completions.jsonl").read_text().splitlines()
    ]
    breakdown = [
        json.loads(line)
        for line in (tmp_path / "reward_logs" / "syntax_aware_breakdown.jsonl").read_text().splitlines()
    ]
    assert len(logged) == len(breakdown) == 4
    assert set(logged[0]) == {"problem_id", "reward", "length", "runaway_penalty_applied", "completion"}
    assert {
        "problem_id",
        "total_reward",
        "structural",
        "type_check",
        "compile",
        "tests",
        "tests_passed",
        "tests_total",
        "syntax_errors",
        "type_errors",
        "stage",
        "reason",
        "error_sample",
        "runaway_penalty_applied",
        "preview",
    } <= set(breakdown[0])
    assert sorted(r["reward"] for r in logged) == sorted(scores)
    assert sum(r["runaway_penalty_applied"] for r in breakdown) == 1


def test_cli_scores_in_order_without_torch(tmp_path, run_python):
    completions = tmp_path / "completions.jsonl"
    rows = [
        {"problem_id": PROBLEMS[1]["id"], "completion": PROBLEMS[1]["solution"] + END_MARKER},
        {"problem_id": PROBLEMS[0]["id"], "completion": "nonsense", "truncated": True},
        {"problem_id": "no-such-problem", "completion": "x"},
    ]
    completions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    command = [sys.executable, "rewards.py", "score", "data/problems.jsonl", str(completions)]
    done = subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "MIN_NON_EMPTY_LINES": "0"},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    printed = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["problem_id"] for r in printed] == [r["problem_id"] for r in rows]
    assert printed[0]["total"] == 1.0 and printed[0]["stage"] == "passed"
    assert printed[1]["runaway_penalty_applied"] and printed[2]["stage"] == "gated"
    for key in ("structural", "type_check", "compile", "tests", "tests_passed", "tests_total", "reason"):
        assert key in printed[0]
    check = (
        "import sys, rewards; rewards.main(sys.argv[1:]); assert 'torch' not in sys.modules, 'torch imported'"
    )
    quiet = run_python("-c", check, "score", "data/problems.jsonl", str(completions), timeout=120)
    assert quiet.returncode == 0, quiet.stderr


def score_without_gate(problems: Path, completions: Path) -> subprocess.CompletedProcess:
    """`rewards.py score PROBLEMS COMPLETIONS --min-non-empty-lines 0`, as a user runs it."""
    command = ["rewards.py", "score", str(problems), str(completions), "--min-non-empty-lines", "0"]
    return subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_cli_reads_csv_problems_and_names_bad_settings(tmp_path):
    import csv

    problems = tmp_path / "problems.csv"
    with problems.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["id", "problem", "tests"])
        writer.writeheader()
        writer.writerow({"id": "sum", "problem": PROBLEM, "tests": TESTS})
    completions = tmp_path / "c.jsonl"
    completions.write_text(
        json.dumps({"problem_id": "sum", "completion": "  List.fold_left ( + ) 0 xs"}) + "\n"
    )
    out = score_without_gate(problems, completions)
    assert json.loads(out.stdout)["total"] == pytest.approx(0.95)
    bad = subprocess.run(
        [sys.executable, "rewards.py", "score", str(problems), str(completions)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "RUNAWAY_PENALTY_MULTIPLIER": "2"},
        timeout=120,
    )
    assert bad.returncode != 0 and "RUNAWAY_PENALTY_MULTIPLIER" in bad.stderr


def escaped(text: str) -> str:
    """A field as some CSV exports write it: each line break as the two characters `\\n`."""
    return text.replace("\n", "\\n")


def unambiguous(problems: list[dict]) -> list[dict]:
    """The problems an export with escaped line breaks can represent: a field that already holds the two
    characters `\\n` (OCaml's own escape, as in hex_encode's tests) reads back as a line break."""
    return [p for p in problems if not any("\\n" in p[key] for key in ("prompt", "tests", "solution"))]


def test_escaped_line_breaks_read_back_exactly():
    fields = [p[key] for p in unambiguous(PROBLEMS + HELDOUT) for key in ("prompt", "tests", "solution")]
    assert len(fields) >= 3 * 300
    assert [unescape_line_breaks(escaped(text)) for text in fields] == fields
    # An OCaml `\\` stays a pair, and a text with a real line break is left as it is.
    assert unescape_line_breaks(r'print_string "a\\n";\nexit 0') == 'print_string "a\\\\n";\nexit 0'
    assert unescape_line_breaks('let s = "a\\n"\nlet t = s') == 'let s = "a\\n"\nlet t = s'


def write_escaped_csv(path: Path, extra_rows: list[dict]) -> Path:
    """The bundled problems with escaped line breaks, and extra_rows after the third."""
    import csv

    rows = [
        {key: escaped(p[key]) for key in ("id", "prompt", "tests", "solution")} for p in unambiguous(PROBLEMS)
    ]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["id", "prompt", "tests", "solution"])
        writer.writeheader()
        writer.writerows(rows[:3] + extra_rows + rows[3:])
    return path


def test_both_loaders_read_escaped_csv_as_the_original(tmp_path, capsys):
    from problems import load_problems

    assert any("type " in p["prompt"] for p in PROBLEMS) and any("type " not in p["prompt"] for p in PROBLEMS)
    source = write_escaped_csv(tmp_path / "problems.csv", [{"id": "no_tests", "prompt": escaped(PROBLEM)}])
    warnings: list[str] = []
    loaded = load_problems(str(source), warn=warnings.append)
    assert [(p["id"], p["problem"], p["tests"], p["solution"]) for p in loaded] == [
        (p["id"], p["prompt"], p["tests"], p["solution"]) for p in unambiguous(PROBLEMS)
    ]
    assert warnings == ["skipped problem no_tests: no tests"]
    assert rewards.problems_by_id(source) == {p["id"]: (p["problem"], p["tests"]) for p in loaded}
    assert capsys.readouterr().err == f"{source}: skipped problem no_tests: no tests\n"


def test_cli_scores_escaped_problems_and_names_malformed_rows(tmp_path):
    bad_rows = [
        {"id": "no_tests", "prompt": escaped(PROBLEM), "tests": ""},
        {"id": "", "prompt": escaped(PROBLEM), "tests": escaped(TESTS)},
        {"id": "no_signature", "prompt": "(** nothing to complete *)", "tests": escaped(TESTS)},
        {"id": PROBLEMS[0]["id"], "prompt": escaped(PROBLEM), "tests": escaped(TESTS)},
    ]
    problems = write_escaped_csv(tmp_path / "problems.csv", bad_rows)
    completions = tmp_path / "completions.jsonl"
    rows = [
        {"problem_id": p["id"], "completion": shapes(p)["signature with plain let"]}
        for p in unambiguous(PROBLEMS)
    ]
    rows.insert(1, {"problem_id": "no_tests", "completion": f"  List.fold_left ( + ) 0 xs\n{END_MARKER}"})
    completions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = score_without_gate(problems, completions)
    assert done.returncode == 0, done.stderr
    assert [line for line in done.stderr.splitlines() if "skipped" in line] == [
        f"{problems}: skipped problem no_tests: no tests",
        f"{problems}: skipped problem row 4: no id",
        f"{problems}: skipped problem no_signature: the problem has no signature line `let f ... =`",
        f"{problems}: skipped problem {PROBLEMS[0]['id']}: duplicate id",
    ]
    printed = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["problem_id"] for r in printed] == [r["problem_id"] for r in rows]
    assert (printed[1]["total"], printed[1]["stage"]) == (0.0, "gated")
    assert [r["total"] for r in printed[:1] + printed[2:]] == [1.0] * len(unambiguous(PROBLEMS))


def test_problem_files_name_what_is_wrong(tmp_path, run_python):
    not_an_object = tmp_path / "problems.jsonl"
    not_an_object.write_text('{"id": "a"}\n["id", "prompt"]\n')
    with pytest.raises(SystemExit, match=r"problems.jsonl:2: not a JSON object"):
        rewards.load_rows(not_an_object)
    missing = run_python(
        "rewards.py", "score", str(tmp_path / "nothing.jsonl"), str(not_an_object), timeout=120
    )
    assert missing.returncode == 2 and "nothing.jsonl: No such file or directory" in missing.stderr


ocaml_ish = st.lists(
    st.sampled_from(
        [
            "let",
            "rec",
            "in",
            "=",
            "->",
            "match",
            "with",
            "|",
            "(*",
            "*)",
            "```",
            "```ocaml\n",
            "\n",
            END_MARKER,
            '"',
            "(",
            ")",
            "begin",
            "end",
            "struct",
            ";;",
            "sum_list",
            "xs",
            "0",
            "type t",
            "and",
            "  ",
            "Here is the code:\n",
        ]
    ),
    max_size=40,
).map(" ".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(max_size=300), ocaml_ish), st.booleans())
def test_fuzz_parsing_never_raises(text, truncated):
    item = rewards.prepare(PROBLEM, TESTS, text, truncated, NO_GATE)
    if item.job is not None:
        assert item.job.code.count("let rec sum_list") + item.job.code.count("let sum_list") >= 1
    rewards.ends_with_marker(text)
    rewards.code_lines(text)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.text(max_size=200), ocaml_ish), min_size=1, max_size=4))
def test_fuzz_scores_stay_in_unit_interval(texts):
    results = score_batch([{"problem": PROBLEM, "tests": TESTS, "completion": t} for t in texts], NO_GATE)
    for r in results:
        assert 0.0 <= r["total_reward"] <= 1.0
        assert r["stage"] in rewards.STAGES
