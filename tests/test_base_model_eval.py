"""test_base_model.py: pass@k by hand, scoring through the real reward, the CLI on the tiny model."""

import json
import math
from pathlib import Path

import pytest

import test_base_model as tbm
from rewards import STAGES, score_batch
from train import FEW_SHOT, build_tiny_model


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 0, 1, 0.0),
        (4, 1, 1, 0.25),
        (4, 1, 2, 1 - 3 / 6),  # 1 - C(3,2)/C(4,2)
        (5, 2, 3, 1 - 1 / 10),  # 1 - C(3,3)/C(5,3)
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
        (4, 3, 2, 1.0),  # fewer failures than draws: a draw of 2 always holds a pass
        (4, 4, 4, 1.0),
    ],
)
def test_pass_at_k_matches_hand_computed_values(n: int, c: int, k: int, expected: float) -> None:
    assert math.isclose(tbm.pass_at_k(n, c, k), expected)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, 1, 0), (4, 1, 5), (4, -1, 1)])
def test_pass_at_k_refuses_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match="pass@k needs"):
        tbm.pass_at_k(n, c, k)


def test_summary_of_completions_scored_by_the_real_reward() -> None:
    """Problem A: 1 of 2 samples correct; problem B: none. pass@1 = (1/2 + 0) / 2, pass@2 = (1 + 0) / 2."""
    problem, tests, answer = FEW_SHOT[0]
    items = [
        {"problem_id": "A", "problem": problem, "tests": tests, "completion": answer},
        {
            "problem_id": "A",
            "problem": problem,
            "tests": tests,
            "completion": "let to_list t = (",
            "truncated": True,
        },
        {
            "problem_id": "B",
            "problem": problem,
            "tests": tests,
            "completion": answer.replace("v :: acc", "acc"),
        },
        {"problem_id": "B", "problem": problem, "tests": tests, "completion": "hello"},
    ]
    rows = score_batch(items)
    summary = tbm.summarize(rows, k=2)
    assert [r["stage"] for r in rows] == ["passed", "gated", "tests_failed", "gated"]
    assert summary["pass@1"] == pytest.approx(0.25) and summary["pass@2"] == pytest.approx(0.5)
    assert summary["stages"]["passed"] == 0.25 and summary["stages"]["gated"] == 0.5
    assert summary["mean_reward"] == pytest.approx(sum(r["total_reward"] for r in rows) / 4)


def test_decision_follows_the_seeds_twenty_percent_rule() -> None:
    weak = tbm.decision("base", {"pass@1": 0.15})
    assert "under 20%" in weak
    for remedy in ("stronger base model", "easier subset", "more few-shot examples"):
        assert remedy in weak
    assert "can learn" in tbm.decision("base", {"pass@1": 0.2})


def test_same_seed_same_problems() -> None:
    problems = [{"id": str(i)} for i in range(50)]
    assert tbm.sample_problems(problems, 10, seed=3) == tbm.sample_problems(problems, 10, seed=3)
    assert tbm.sample_problems(problems, 10, seed=3) != tbm.sample_problems(problems, 10, seed=4)
    assert len(tbm.sample_problems(problems[:4], 10, seed=0)) == 4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The demo's tiny model and a LoRA adapter on it whose weights are not zero, so it changes the model."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("tiny")
    model_dir = build_tiny_model(root / "model")
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(model, lora).save_pretrained(root / "adapter")
    return model_dir, root / "adapter"


def test_cli_compares_base_and_adapter_on_the_tiny_model(
    tiny: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    model_dir, adapter = tiny
    monkeypatch.setenv("GRPO_MAX_COMPLETION", "16")
    out = tmp_path / "eval.jsonl"
    argv = ["--model", str(model_dir), "--adapter", str(adapter), "--problems", "data/problems.jsonl"]
    assert tbm.main([*argv, "-n", "2", "-k", "3", "--seed", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["model"] for r in rows] == ["base"] * 6 + ["base+adapter"] * 6
    assert {r["problem_id"] for r in rows[:6]} == {r["problem_id"] for r in rows[6:]} and len(rows[0]) > 5
    assert all(r["stage"] in STAGES and 0.0 <= r["total_reward"] <= 1.0 for r in rows)
    assert [r["completion"] for r in rows[:6]] != [r["completion"] for r in rows[6:]]
    assert "| model | pass@1 | pass@3 | mean reward | gated |" in printed
    assert "| base | " in printed and "| base+adapter | " in printed
    assert "under 20%" in printed and "adapter effect: pass@1 +0.0 points" in printed


def test_cli_names_a_bad_adapter(
    tiny: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model_dir, _ = tiny
    argv = [
        "--model",
        str(model_dir),
        "--adapter",
        str(tmp_path),
        "--problems",
        "data/problems.jsonl",
        "-n",
        "1",
    ]
    assert tbm.main([*argv, "-k", "1", "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "no adapter_config.json" in capsys.readouterr().err
