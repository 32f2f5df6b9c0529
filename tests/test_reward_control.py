"""GRPO_REWARD_CONTROL=shuffled: the control run trains on the OCaml reward's values permuted across each
step's completions, while every log keeps the real rewards; through the real reward, sandbox and TRL."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from problems import BUNDLED_PROBLEMS, load_problems
from reward_control import ShuffledReward
from rewards import END_MARKER, RewardConfig, SyntaxAwareReward
from train import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def completions() -> tuple[list[dict], list[str]]:
    """Eight completions of four problems, from a right answer (reward 1) to junk (0)."""
    problems = load_problems(str(BUNDLED_PROBLEMS))[:4]
    rows, texts = [], []
    for p in problems:
        rows += [p, p]
        texts += [f"```ocaml\n{p['problem']}\n{p['solution']}\n{END_MARKER}\n```", "I do not know OCaml."]
    return rows, texts


def rewards_of(reward, rows: list[dict], texts: list[str]) -> list[float]:
    kwargs = {"problem": [p["problem"] for p in rows], "tests": [p["tests"] for p in rows]}
    kwargs["problem_id"] = [p["id"] for p in rows]
    return asyncio.run(reward(prompts=[""] * len(texts), completions=texts, **kwargs))


def test_the_control_gets_the_real_rewards_permuted_and_the_logs_keep_the_real_ones(tmp_path: Path) -> None:
    rows, texts = completions()
    real = SyntaxAwareReward(RewardConfig(reward_workers=2), log_dir=tmp_path / "logs")
    try:
        truth = rewards_of(real, rows, texts)
        assert truth == [1.0, 0.0] * 4
        shuffled = [rewards_of(ShuffledReward(real, seed=7), rows, texts) for _ in range(2)]
        assert shuffled[0] == shuffled[1], "seeded: a control run is reproducible"
        assert sorted(shuffled[0]) == sorted(truth) and shuffled[0] != truth
        assert rewards_of(ShuffledReward(real, seed=8), rows, texts) != shuffled[0]
    finally:
        real.close()
    logged = [json.loads(line) for line in (tmp_path / "logs" / "completions.jsonl").read_text().splitlines()]
    assert len(logged) == 4 * len(texts)
    assert all(row["reward"] == (1.0 if row["completion"].startswith("```") else 0.0) for row in logged)


def test_a_control_run_trains_and_says_what_it_is(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    flags = [
        "--model-id",
        str(tiny_model),
        "--output-dir",
        str(out),
        "--training-dataset",
        str(BUNDLED_PROBLEMS),
    ]
    flags += ["--batch-size", "2", "--num-generations", "2", "--max-completion", "16", "--max-steps", "2"]
    flags += ["--eval-steps", "none", "--report-to", "none"]  # trackio would set TRACKIO_DIR in this process
    assert main([*flags, "--reward-control", "shuffled"], environ={}) == 0
    log = (out / "learning.log").read_text(encoding="utf-8")
    assert "| `GRPO_REWARD_CONTROL` | `shuffled` |" in (out / "adapter" / "README.md").read_text(
        encoding="utf-8"
    )
    assert "# GRPO_REWARD_CONTROL=shuffled: a control run" in log
    assert len([line for line in log.splitlines() if line.startswith("[Epoch")]) == 2
