"""The real model's committed evaluations (bench/results/real_model/: the learning bench's, and the base
models' baselines) re-score to the same verdicts with the reward as it is now (rewards.py score), and the
bench's results.md is the table of its results.jsonl. No model runs here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.real_model_learning import MULTIPL_E_EVEN, RESULTS, read_results, table
from problems import HELDOUT_PROBLEMS
from rewards import RewardConfig, score_files

ROOT = Path(__file__).resolve().parents[1]
ROWS = read_results()
# eval_heldout*.jsonl: data/heldout.jsonl; eval_multipl_e*.jsonl: MultiPL-E's even half, repaired
# (REPAIR_PROBLEMS=1) unless the name says `published`.
EVALUATIONS = sorted(str(path.relative_to(ROOT)) for path in RESULTS.glob("**/eval_*.jsonl"))


def test_the_results_table_is_the_table_of_the_rows() -> None:
    if not ROWS:
        pytest.skip("no arm measured yet: bench/results/real_model/results.jsonl is empty")
    assert (RESULTS / "results.md").read_text(encoding="utf-8") == table(ROWS)
    for row in ROWS:
        assert {"arm", "settings", "base_eval", "trained_eval", "minutes"} <= set(row)
        named = [row[key] for key in ("base_eval", "trained_eval", "base_multipl_e", "trained_multipl_e")]
        assert all(path in EVALUATIONS for path in named)


@pytest.mark.parametrize("path", EVALUATIONS)
def test_a_committed_evaluation_rescores_to_the_same_verdicts(path: str) -> None:
    multipl_e = "multipl_e" in Path(path).name
    if multipl_e and not MULTIPL_E_EVEN.is_file():
        pytest.skip(f"MultiPL-E's even half is not here: {MULTIPL_E_EVEN}")
    problems = MULTIPL_E_EVEN if multipl_e else HELDOUT_PROBLEMS
    # As they were evaluated: the default reward, MultiPL-E repaired unless the file says `published`.
    cfg = RewardConfig(repair_problems=multipl_e and "published" not in Path(path).name)
    rows = [json.loads(line) for line in (ROOT / path).read_text(encoding="utf-8").splitlines()]
    rescored = score_files(problems, ROOT / path, cfg)
    verdicts = [(r["stage"], r["stage"] == "passed") for r in rescored]
    assert verdicts == [(r["stage"], r["passed"]) for r in rows]
