"""MultiPL-E as a source, on fixtures written here in its layout (tests/fixtures/multipl_e_humaneval_ml.jsonl:
`name`, `prompt`, `tests`, `stop_tokens`, ...): its rows load, its rendering bugs are found and repaired only
when asked, a short correct answer counts as a pass, and its own sampling protocol runs on a real model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import evaluate
import multipl_e
from problem_check import check_problems
from rewards import RewardConfig, reference_program, score_batch

FIXTURES = Path(__file__).resolve().parent / "fixtures"
HUMANEVAL = FIXTURES / "multipl_e_humaneval_ml.jsonl"
ANSWERS = FIXTURES / "multipl_e_answers.jsonl"
CFG = RewardConfig(reward_workers=2)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def fixture_problems() -> list[dict]:
    rows = [json.loads(line) for line in HUMANEVAL.read_text().splitlines()]
    return [{"id": r["name"], "problem": r["prompt"].strip(), "tests": r["tests"]} for r in rows]


def test_sources_carry_a_config_and_a_split(tmp_path):
    assert multipl_e.split_source("nuprl/MultiPL-E:humaneval-ml") == ("nuprl/MultiPL-E", "humaneval-ml", None)
    assert multipl_e.split_source("nuprl/MultiPL-E:mbpp-ml:test") == ("nuprl/MultiPL-E", "mbpp-ml", "test")
    assert multipl_e.split_source("kiranpg/ocaml-training-problems") == (
        "kiranpg/ocaml-training-problems",
        None,
        None,
    )
    local = tmp_path / "a:b"  # an existing path is a path, colon or not
    local.write_text("")
    assert multipl_e.split_source(str(local)) == (str(local), None, None)

    assert multipl_e.choose_split(["test"], None, "x") == "test"
    assert multipl_e.choose_split(["test", "train"], None, "x") == "train"
    assert multipl_e.choose_split(["test", "train"], "test", "x") == "test"
    with pytest.raises(ValueError, match="several splits \\(test, validation\\)"):
        multipl_e.choose_split(["test", "validation"], None, "x")
    with pytest.raises(ValueError, match="no split 'train' \\(it has test\\)"):
        multipl_e.choose_split(["test"], "train", "x")


def test_repairs_touch_code_only_and_are_counted():
    tests = (
        'let () =\n  assert (f [(~4); .5] (~3).0 = "(~1) .5");\n'
        "  (* (~2) .5 *)\n  assert (g '~' x.(1) 1.5 = (~7))\n"
    )
    repaired, counts = multipl_e.repair_tests(tests)
    assert repaired == (
        'let () =\n  assert (f [(-4); 0.5] (-3.0) = "(~1) .5");\n'
        "  (* (~2) .5 *)\n  assert (g '~' x.(1) 1.5 = (-7))\n"
    )
    assert counts == {"negative literal `(~N)`": 3, "float `.N`": 1}
    assert multipl_e.describe(counts) == "3 negative literals `(~N)`, 1 float `.N`"
    assert multipl_e.repair_tests(repaired) == (repaired, {})


def test_rendering_bugs_break_problems_until_repaired():
    problems = fixture_problems()
    broken = dict(check_problems(problems, CFG, reference_program).broken)
    assert sorted(broken) == ["HumanEval_1_count_below", "HumanEval_2_halve_all", "HumanEval_4_is_even"]
    assert "tests line 6: `(~4)`, a known MultiPL-E rendering bug" in broken["HumanEval_1_count_below"]
    assert "tests line 4: `.5`" in broken["HumanEval_2_halve_all"]
    assert "REPAIR_PROBLEMS" not in broken["HumanEval_4_is_even"]  # a real error, nothing to repair

    notes = []
    repaired, counts = multipl_e.repair_problems(problems, notes.append)
    assert counts == {"negative literal `(~N)`": 4, "float `.N`": 1}
    assert notes == [
        "repaired problem HumanEval_1_count_below: 3 negative literals `(~N)`",
        "repaired problem HumanEval_2_halve_all: 1 negative literal `(~N)`, 1 float `.N`",
        "REPAIR_PROBLEMS: 4 negative literals `(~N)`, 1 float `.N` repaired in 2 of 5 problems",
    ]
    # The string in HumanEval_3_shout's tests holds `(~1) .5`: left alone, so the problem stays as it was.
    assert repaired[3] == problems[3]
    assert [problem_id for problem_id, _ in check_problems(repaired, CFG, reference_program).broken] == [
        "HumanEval_4_is_even"
    ]


def test_right_answers_pass_and_wrong_ones_fail_once_repaired():
    problems = {p["id"]: p for p in multipl_e.repair_problems(fixture_problems(), lambda _: None)[0]}
    answers = [json.loads(line) for line in ANSWERS.read_text().splitlines()]
    items = [
        {**a, "problem": problems[a["problem_id"]]["problem"], "tests": problems[a["problem_id"]]["tests"]}
        for a in answers
        if a["problem_id"] != "HumanEval_4_is_even"
    ]
    ungated = RewardConfig(reward_workers=2, min_non_empty_lines=0)
    stages = [(a["kind"], s["stage"]) for a, s in zip(items, score_batch(items, ungated), strict=True)]
    assert stages == [("right", "passed"), ("wrong", "tests_failed")] * 4
    # Under the training default (MIN_NON_EMPTY_LINES=8) the one-line wrong answers are gated (reward 0) and
    # the right ones still pass.
    assert [s["stage"] for s in score_batch(items, CFG)] == ["passed", "gated"] * 4


def test_stop_sequences_cut_the_continuation():
    stop = multipl_e.MULTIPL_E.stop
    assert multipl_e.stop_at_stop_sequence("  x + 1\n\nlet y = 2", stop) == ("  x + 1", True)
    assert multipl_e.stop_at_stop_sequence("  match x with\n  | _ -> 0\nlet z", stop) == (
        "  match x with\n  | _ -> 0",
        True,
    )
    assert multipl_e.stop_at_stop_sequence("  x", stop) == ("  x", False)


def test_protocol_samples_raw_continuations(tiny_model, one_torch_thread):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    protocol = multipl_e.Protocol(max_new_tokens=24)
    problems = fixture_problems()[:2]
    model.train()
    samples = evaluate.sample_continuations(
        model, tokenizer, problems, k=3, batch_size=4, seed=0, protocol=protocol
    )
    again = evaluate.sample_continuations(
        model, tokenizer, problems, k=3, batch_size=4, seed=0, protocol=protocol
    )
    assert samples == again  # the seed fixes the stream
    assert [(s["problem_id"], s["sample"]) for s in samples] == [
        (p["id"], i) for p in problems for i in range(3)
    ]
    for s in samples:
        assert not any(stop in s["completion"] for stop in protocol.stop)
        assert 0 < s["length"] <= 24
        assert not s["truncated"] or s["length"] == 24
    assert model.training  # put back as it was


def test_a_local_export_in_multipl_e_columns_loads_by_name(tmp_path):
    from problems import load_problems

    export = tmp_path / "humaneval-ml"  # as the hub has it: one config, a `test` split only
    export.mkdir()
    (export / "test.jsonl").write_text(HUMANEVAL.read_text())
    warnings = []
    problems = load_problems(str(export), warn=warnings.append)
    assert [p["id"] for p in problems] == [p["id"] for p in fixture_problems()]
    assert problems[0]["problem"].endswith("let larger (a : int) (b : int) : int =")
    assert warnings == []
    assert [p["id"] for p in load_problems(str(HUMANEVAL))] == [p["id"] for p in problems]


def test_a_short_correct_answer_passes_and_a_short_wrong_one_is_gated():
    from evaluate import score_samples, summarize

    problems = [{**p, "difficulty": "unknown"} for p in fixture_problems()[:1]]
    samples = [
        {
            "problem_id": "HumanEval_0_larger",
            "sample": 0,
            "completion": "  if a > b then a else b",
            "truncated": False,
        },
        {"problem_id": "HumanEval_0_larger", "sample": 1, "completion": "  a", "truncated": False},
    ]
    rows = score_samples([{**s, "length": 9} for s in samples], problems, CFG)  # MIN_NON_EMPTY_LINES=8
    assert [(r["passed"], r["stage"], r["total_reward"]) for r in rows] == [
        (True, "passed", 0.95),  # no END marker: the structural share is missing
        (False, "gated", 0.0),
    ]
    summary = summarize(rows, k=2)
    assert (summary["pass@1"], summary["pass@2"], summary["mean_reward"]) == (0.5, 1.0, 0.475)


def test_evaluate_runs_multipl_e_protocol_on_a_local_export(tmp_path, tiny_model, one_torch_thread):
    from evaluate import main

    export = tmp_path / "humaneval-ml"
    export.mkdir()
    (export / "test.jsonl").write_text(HUMANEVAL.read_text())
    out = tmp_path / "eval"
    args = [str(tiny_model), "--problems", str(export), "--protocol", "multipl-e", "-n", "2", "-k", "2"]
    assert main([*args, "--out-dir", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "eval_model.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(isinstance(r["passed"], bool) for r in rows)
    assert {r["problem_id"] for r in rows} <= {"HumanEval_0_larger", "HumanEval_3_shout"}  # the usable ones
    assert not any(stop in r["completion"] for r in rows for stop in multipl_e.MULTIPL_E.stop)
    report = (out / "eval_report.md").read_text()
    assert "MultiPL-E's protocol: raw prompt, temperature 0.2, top-p 0.95, up to 512 new tokens" in report


def test_score_cli_matches_completions_by_name_and_repairs_when_asked():
    import subprocess
    import sys

    root = FIXTURES.parents[1]
    command = [
        sys.executable,
        "rewards.py",
        "score",
        str(HUMANEVAL),
        str(ANSWERS),
        "--min-non-empty-lines",
        "0",
    ]
    plain = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=120)
    repaired = subprocess.run(
        [*command, "--repair-problems"], cwd=root, capture_output=True, text=True, timeout=120
    )
    kinds = [json.loads(line)["kind"] for line in ANSWERS.read_text().splitlines()]
    stages = {
        name: [
            (kind, json.loads(line)["stage"])
            for kind, line in zip(kinds, run.stdout.splitlines(), strict=True)
        ]
        for name, run in (("plain", plain), ("repaired", repaired))
    }
    # Unrepaired, the `(~N)` and `.N` problems fail to compile whatever the answer; repaired, they are fair.
    assert stages["plain"] == [
        *[("right", "passed"), ("wrong", "tests_failed")],
        *[("right", "compile_error"), ("wrong", "compile_error")] * 2,
        *[("right", "passed"), ("wrong", "tests_failed")],
        *[("right", "compile_error"), ("wrong", "compile_error")],
    ]
    assert stages["repaired"][:8] == [("right", "passed"), ("wrong", "tests_failed")] * 4
    assert (
        "REPAIR_PROBLEMS: 4 negative literals `(~N)`, 1 float `.N` repaired in 2 of 5 problems"
        in repaired.stderr
    )
