"""MultiPL-E's HumanEval-OCaml, even-numbered half (../shared/multipl-e/humaneval-ml-even.jsonl, read by path,
never copied here): REPAIR_PROBLEMS's rules leave no problem broken by a rendering fault, and the reference
solutions written for this project (data/multipl_e_solutions.jsonl) pass every test of their repaired problems
through the reward itself, where the unrepaired tests of a repaired problem fail them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import multipl_e
from problem_check import leave_out_broken
from problems import load_rows, usable_problems
from rewards import RewardConfig, reference_program, score_batch

ROOT = Path(__file__).resolve().parents[1]
EVEN = ROOT.parent / "shared" / "multipl-e" / "humaneval-ml-even.jsonl"
SOLUTIONS = ROOT / "data" / "multipl_e_solutions.jsonl"
CFG = RewardConfig(reward_workers=2, repair_problems=True, min_non_empty_lines=0)

pytestmark = pytest.mark.skipif(not EVEN.is_file(), reason=f"needs MultiPL-E's even half at {EVEN}")


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def even_half() -> list[dict]:
    return usable_problems(load_rows(EVEN), lambda line: pytest.fail(line))


def solutions() -> dict[str, str]:
    rows = [json.loads(line) for line in SOLUTIONS.read_text().splitlines()]
    assert len({row["name"] for row in rows}) == len(rows), "one solution per problem"
    return {row["name"]: row["solution"] for row in rows}


def test_unrepaired_the_benchmark_is_byte_for_byte_multipl_e():
    rows = load_rows(EVEN)
    assert [(p["id"], p["problem"], p["tests"]) for p in even_half()] == [
        (row["name"], row["prompt"].strip(), row["tests"]) for row in rows
    ]


def test_repaired_only_a_problem_whose_own_tests_are_wrong_is_left_out():
    notes: list[str] = []
    kept, result = leave_out_broken(even_half(), CFG, reference_program, notes.append)
    assert (len(kept), result.summary()) == (75, "75 of 76 problems usable")
    [(problem_id, reason)] = result.broken
    # Python's any_int(3, 4, 7) and any_int(3.0, 4, 7) expect True and False; with float parameters the
    # translator renders both as `candidate 3.0 4.0 7.0`.
    assert problem_id == "HumanEval_92_any_int"
    assert reason.startswith("the tests contradict each other: lines 12 and 13 expect `true` and `false`")
    assert any(note.startswith("REPAIR_PROBLEMS: 163 negative literals `(~N)`, 2 quotes") for note in notes)


def test_every_reference_solution_passes_its_repaired_problem_and_not_the_unrepaired_one():
    written = solutions()
    assert len(written) >= 20
    problems = {p["id"]: p for p in even_half()}
    assert set(written) <= set(problems)
    repaired = {p["id"]: p for p in multipl_e.repair_problems(list(problems.values()), lambda _: None)[0]}
    names = sorted(written)
    items = [
        {
            "problem_id": n,
            "problem": repaired[n]["problem"],
            "tests": repaired[n]["tests"],
            "completion": written[n],
        }
        for n in names
    ]
    stages = {row["problem_id"]: (row["stage"], row["error_sample"][:200]) for row in score_batch(items, CFG)}
    assert {n: stage for n, stage in stages.items() if stage[0] != "passed"} == {}
    # Most are for problems a rule repaired: unrepaired, the same right answer cannot even compile there.
    fixed = [n for n in names if repaired[n] != problems[n]]
    assert len(fixed) >= 15
    plain = [
        {
            **item,
            "tests": problems[item["problem_id"]]["tests"],
            "problem": problems[item["problem_id"]]["problem"],
        }
        for item in items
        if item["problem_id"] in fixed
    ]
    unrepaired = {row["problem_id"]: row["stage"] for row in score_batch(plain, CFG)}
    assert set(unrepaired.values()) <= {"type_error", "compile_error"}, unrepaired
