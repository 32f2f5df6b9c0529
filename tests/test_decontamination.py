"""The training problems' evidence, through the reward's own sandbox: each has a plausible wrong answer
(data/wrong_answers.jsonl) that compiles and fails its tests, so the tests discriminate; and none overlaps a
held-out set, by function name or by behaviour (decontamination.py)."""

from __future__ import annotations

import json

import pytest

import decontamination
from problem_check import check_problems
from problems import BUNDLED_PROBLEMS, HELDOUT_PROBLEMS, ROOT, load_rows, usable_problems
from rewards import RewardConfig, reference_program

WRONG_ANSWERS = ROOT / "data" / "wrong_answers.jsonl"
CFG = RewardConfig(reward_workers=2)
TRAINING = usable_problems(load_rows(BUNDLED_PROBLEMS), pytest.fail)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_every_training_problem_has_a_wrong_answer_that_compiles_and_fails_its_tests() -> None:
    wrong = [json.loads(line) for line in WRONG_ANSWERS.read_text(encoding="utf-8").splitlines()]
    by_id = {p["id"]: p for p in TRAINING}
    assert {w["id"] for w in wrong} == set(by_id), "a problem without a wrong answer, or one for no problem"
    runs = [
        {**by_id[w["id"]], "id": f"{w['id']} #{i}", "solution": w["solution"]} for i, w in enumerate(wrong)
    ]
    verdicts = dict(check_problems(runs, CFG, reference_program).broken)
    accepted = [run["id"] for run in runs if run["id"] not in verdicts]
    assert not accepted, f"the tests accept these wrong answers: {accepted}"
    uncompiled = {i: e for i, e in verdicts.items() if "does not compile" in e}
    assert not uncompiled, f"a wrong answer must be plausible, so it compiles: {uncompiled}"
    assert all("passes" in error for error in verdicts.values())


def test_no_training_problem_shares_a_name_or_a_behaviour_with_a_held_out_one() -> None:
    references = decontamination.held_out_references()
    assert len(references) >= 48
    assert decontamination.name_clashes(TRAINING, decontamination.held_out_names()) == []
    assert decontamination.behaviour_clashes(TRAINING, references, CFG, reference_program) == []


def test_a_held_out_problem_under_another_name_is_caught_by_its_behaviour() -> None:
    # alternating_sum, renamed, with tests of our own that its reference passes; and a look-alike of the same
    # type (the plain sum) that it does not pass.
    heldout = usable_problems(load_rows(HELDOUT_PROBLEMS), pytest.fail)
    references = [p for p in heldout if p["id"] == "alternating_sum"]
    prompt = (
        "(** The sum of [xs] with every second element negated. *)\nlet plus_minus (xs : int list) : int ="
    )
    disguised = {
        "id": "plus_minus",
        "problem": prompt,
        "tests": "let () =\n  assert (plus_minus [5; 2] = 3);\n;;",
    }
    plain = {**disguised, "id": "plain_sum", "tests": "let () =\n  assert (plus_minus [5; 2] = 7);\n;;"}
    clashes = decontamination.behaviour_clashes([disguised, plain], references, CFG, reference_program)
    assert clashes == [
        "plus_minus: held-out problem alternating_sum's reference solution passes all of its tests"
    ]
    assert decontamination.name_clashes(
        [{**disguised, "problem": prompt.replace("plus_minus", "is_leap_year")}],
        decontamination.held_out_names(),
    )
