"""The real model's committed evaluations (bench/results/real_model/: the learning bench's, and the base
models' baselines) re-score to the same stages and rewards with the reward as it is now (rewards.py score),
and every figure of the bench's results.jsonl is what the committed files say, recomputed here from the
evaluation files and each arm's learning.log, not by the bench's own code. No model runs here."""

from __future__ import annotations

import json
import os
import re
import statistics
from collections import Counter
from math import comb
from pathlib import Path

import pytest

from analyze import read_log
from bench.real_model_learning import (
    ARMS,
    EVALUATIONS,
    MULTIPL_E_EVEN,
    PRIMARY,
    RESULTS,
    SHARED,
    evaluates,
    read_results,
    sign_tests,
    table,
    warm_start_settings,
)
from problems import BUNDLED_PROBLEMS, HELDOUT_PROBLEMS
from rewards import STAGES, RewardConfig, score_files
from stats import bootstrap_interval, holm, sign_test

ROOT = Path(__file__).resolve().parents[1]
ROWS = read_results()
# eval_heldout*.jsonl: data/heldout.jsonl; eval_training.jsonl: data/problems.jsonl; eval_multipl_e*.jsonl:
# MultiPL-E's even half, repaired (REPAIR_PROBLEMS=1) unless the name says `published`.
COMMITTED = sorted(str(path.relative_to(ROOT)) for path in RESULTS.glob("**/eval_*.jsonl"))


def per_problem(path: str) -> tuple[list[dict], dict[str, tuple[int, int, float]]]:
    """An evaluation file's rows, and per problem (samples, passing samples, mean reward)."""
    rows = [json.loads(line) for line in (ROOT / path).read_text(encoding="utf-8").splitlines()]
    problems: dict[str, list[dict]] = {}
    for r in rows:
        problems.setdefault(str(r["problem_id"]), []).append(r)
    return rows, {
        pid: (len(g), sum(r["stage"] == "passed" for r in g), statistics.fmean(r["total_reward"] for r in g))
        for pid, g in problems.items()
    }


def figures(base: str, trained: str, k: int) -> dict:
    """pass@1 with its 95% bootstrap interval over problems, pass@k (Chen et al.'s unbiased estimate,
    averaged over problems), mean reward, stage shares, and the problems whose pass rate (or, at an equal
    pass rate, mean reward) rose and fell."""
    found = {}
    for when, path in (("before", base), ("after", trained)):
        rows, problems = per_problem(path)
        found[when] = problems
        for j in sorted({1, k}):
            rates = [1 - comb(n - c, j) / comb(n, j) for n, c, _ in problems.values()]
            found[f"pass@{j}_{when}"] = statistics.fmean(rates)
        found[f"pass@1_interval_{when}"] = list(bootstrap_interval([c / n for n, c, _ in problems.values()]))
        found[f"mean_reward_{when}"] = statistics.fmean(r["total_reward"] for r in rows)
        stages = Counter(r["stage"] for r in rows)
        found[f"stages_{when}"] = {stage: stages[stage] / len(rows) for stage in STAGES}
    before, after = found.pop("before"), found.pop("after")
    change = {
        pid: (after[pid][1] / after[pid][0] - before[pid][1] / before[pid][0], after[pid][2] - before[pid][2])
        for pid in before
    }
    found["improved"] = {p for p, (ds, dr) in change.items() if ds > 0 or (ds == 0 and dr > 1e-6)}
    found["regressed"] = {p for p, (ds, dr) in change.items() if ds < 0 or (ds == 0 and dr < -1e-6)}
    return found


@pytest.mark.parametrize("row", ROWS, ids=[r["arm"] for r in ROWS])
def test_an_arms_figures_are_what_its_committed_files_say(row: dict) -> None:
    evaluated = [name for name in EVALUATIONS if f"trained_{name}" in row]
    assert evaluated[:2] == ["heldout", "multipl_e"]  # every arm has both; the sampled MultiPL-E came later
    for key in evaluated:
        recorded, expected = row[key], figures(row[f"base_{key}"], row[f"trained_{key}"], EVALUATIONS[key])
        for problems in ("improved", "regressed"):
            assert set(recorded[problems]) == expected.pop(problems), problems
        for when in ("before", "after"):
            assert recorded[f"stages_{when}"] == pytest.approx(expected.pop(f"stages_{when}"))
            interval = f"pass@1_interval_{when}"
            assert recorded[interval] == pytest.approx(expected.pop(interval))
        assert {figure: recorded[figure] for figure in expected} == pytest.approx(expected)
    if not row["steps"]:  # SFT alone: no GRPO step, no GRPO log
        assert row["rewards"] == [] and not (RESULTS / row["arm"] / "learning.log").exists()
        return
    # learning.log prints each step's reward to 3 decimals and frac_zero_std, the sampled groups' share, to 2
    steps, _, _ = read_log(RESULTS / row["arm"] / "learning.log")
    rewards = [s["reward"] for s in steps]
    assert row["rewards"] == pytest.approx(rewards, abs=6e-4)
    assert row["train_reward_first5"] == pytest.approx(statistics.fmean(rewards[:5]), abs=6e-4)
    assert row["train_reward_last5"] == pytest.approx(statistics.fmean(rewards[-5:]), abs=6e-4)
    sampled_zero_std = statistics.fmean(s["frac_reward_zero_std"] for s in steps)
    assert row["mean_frac_zero_std"] == pytest.approx(sampled_zero_std, abs=5e-3)


def test_the_results_table_is_the_table_of_the_rows() -> None:
    if not ROWS:
        pytest.skip("no arm measured yet: bench/results/real_model/results.jsonl is empty")
    assert (RESULTS / "results.md").read_text(encoding="utf-8") == table(ROWS)
    for row in ROWS:
        assert {"arm", "settings", "base_heldout", "trained_heldout", "minutes"} <= set(row)
        named = [row[f"{when}_{name}"] for name in EVALUATIONS for when in ("base", "trained") if name in row]
        assert all(path in COMMITTED for path in named)


@pytest.mark.parametrize("path", COMMITTED)
def test_a_committed_evaluation_rescores_to_the_same_verdicts(path: str) -> None:
    multipl_e = "multipl_e" in Path(path).name
    if multipl_e and not MULTIPL_E_EVEN.is_file():
        pytest.skip(f"MultiPL-E's even half is not here: {MULTIPL_E_EVEN}")
    training = Path(path).name == "eval_training.jsonl"
    problems = MULTIPL_E_EVEN if multipl_e else BUNDLED_PROBLEMS if training else HELDOUT_PROBLEMS
    # As they were evaluated: the default reward, MultiPL-E repaired unless the file says `published`.
    cfg = RewardConfig(repair_problems=multipl_e and "published" not in Path(path).name)
    rows = [json.loads(line) for line in (ROOT / path).read_text(encoding="utf-8").splitlines()]
    rescored = score_files(problems, ROOT / path, cfg)
    assert [(r["stage"], r["stage"] == "passed") for r in rescored] == [
        (r["stage"], r["passed"]) for r in rows
    ]
    assert [r["total_reward"] for r in rescored] == pytest.approx([r["total_reward"] for r in rows], abs=1e-6)


NUMBER = r"[0-9]+(?:\.[0-9]+)?(?:e-?[0-9]+)?"  # a figure as written: 0.75, 0.005, 4.9e-05


def within_its_rounding(written: str, value: float) -> bool:
    """Whether `value` rounds to the figure as written: 0.05 stands for 0.045 up to 0.055."""
    mantissa, _, exponent = written.lower().partition("e")
    decimals = len(mantissa.partition(".")[2]) - int(exponent or 0)
    return abs(float(written) - value) <= 0.5 * 10**-decimals + 1e-12


@pytest.mark.parametrize("page", ["docs/real-model.md", "BENCHMARKS.md"])
def test_the_p_values_in_the_docs_are_the_sign_tests_and_holms(page: str) -> None:
    """Every "improved / regressed (p)" cell, every "N improved, M regressed ... p = X" sentence and every
    Holm-adjusted p in the page is what stats.py computes from the counts."""
    text = " ".join((ROOT / page).read_text(encoding="utf-8").split())
    cells = re.findall(rf"\| (\d+) / (\d+) \(({NUMBER})\) \|", text)
    sentences = re.findall(
        rf"(\d+) (?:problems )?improved,? (?:against )?(\d+) regressed[,;]? \(?(?:sign test )?p = ({NUMBER})",
        text,
    )
    assert cells and sentences
    for improved, regressed, p in cells:
        assert p == f"{sign_test(int(improved), int(regressed)):.2g}", (improved, regressed, p)
    for improved, regressed, p in sentences:
        assert within_its_rounding(p, sign_test(int(improved), int(regressed))), (improved, regressed, p)
    others = {name: p for name, p in sign_tests(ROWS).items() if name not in PRIMARY}  # as holm_note
    adjusted = holm(others).values()
    written = re.findall(rf"adjusted (?:p )?({NUMBER})", text)
    assert written and all(any(within_its_rounding(p, a) for a in adjusted) for p in written), written


def test_the_recipes_adapter_is_committed_in_bf16_naming_its_base_in_the_repository(
    tiny_model: Path, tmp_path: Path
) -> None:
    """portable_adapter on a real PEFT adapter (of the tiny model, its LoRA B trained away from zero): bf16
    weights equal to the trained ones rounded, the base named as `make real-model` makes it, and on that base
    (here the tiny model, given as evaluate.py's --base) the same logits as the adapter it came from."""
    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from bench.real_model_learning import MODEL, portable_adapter, repository_path
    from models import load_model

    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model), LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    )
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "lora_B" in name:
                weight.normal_(std=0.5, generator=torch.Generator().manual_seed(0))
    trained = tmp_path / "adapter"
    model.save_pretrained(trained)
    load = 'tokenizer = AutoTokenizer.from_pretrained("{}")\n'  # as the run's model card loads it
    (trained / "README.md").write_text("# the run's model card\n" + load.format("adapter"), encoding="utf-8")

    committed = portable_adapter(trained, tmp_path / "committed")

    assert sorted(p.name for p in committed.iterdir()) == [
        "README.md",
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    config = json.loads((committed / "adapter_config.json").read_text(encoding="utf-8"))
    assert config["base_model_name_or_path"] == repository_path(MODEL.folder) == "models/" + MODEL.folder.name
    card = (committed / "README.md").read_text(encoding="utf-8")  # no tokenizer here: the base's
    assert card == "# the run's model card\n" + load.format(config["base_model_name_or_path"])
    original, saved = (
        load_file(trained / "adapter_model.safetensors"),
        load_file(committed / "adapter_model.safetensors"),
    )
    assert original.keys() == saved.keys() and all(v.dtype == torch.bfloat16 for v in saved.values())
    assert all(torch.equal(saved[k], original[k].to(torch.bfloat16)) for k in original)
    tokens = torch.tensor([[1, 5, 9, 2, 7]])
    reference, _ = load_model(str(trained), base=str(tiny_model))
    loaded, _ = load_model(str(committed), base=str(tiny_model))
    with torch.no_grad():
        expected, got = reference(tokens).logits, loaded(tokens).logits
        with reference.disable_adapter():
            assert (reference(tokens).logits - expected).abs().max() > 0.1  # the adapter does something
    assert torch.allclose(got, expected, atol=2e-2), (got - expected).abs().max()


def test_the_sft_arms_share_one_warm_start_which_grpo_settings_do_not_split() -> None:
    def warm(arm: str, **changes: str) -> dict[str, str]:
        return warm_start_settings({**SHARED, **ARMS[arm].settings, **changes})

    assert (
        warm("recipe")
        == warm("sft-only")
        == warm("random-reward")
        == warm("recipe-24")
        == warm("random-reward-24")
    )
    assert warm("recipe", GRPO_MAX_STEPS="40", GRPO_LEARNING_RATE="1e-5") == warm("recipe")
    assert warm("recipe", LORA_R="16") != warm("recipe")
    assert warm("recipe", GRPO_FEW_SHOT="1") != warm("recipe")  # the SFT rows' prompt


def test_an_evaluation_is_kept_only_when_made_after_its_model_by_the_same_command(
    tmp_path: Path,
) -> None:
    model = tmp_path / "adapter"
    model.mkdir()
    (model / "adapter_model.safetensors").write_bytes(b"weights")
    made = tmp_path / "eval_heldout.jsonl"
    made_with = {"command": ["evaluate.py", str(model), "-k", "4"], "settings": {"GRPO_FEW_SHOT": "0"}}
    assert not evaluates(made, model, made_with)
    made.write_text("{}\n", encoding="utf-8")
    os.utime(model / "adapter_model.safetensors", (1_000, 1_000))
    assert not evaluates(made, model, made_with)  # no record of how it was made
    made.with_suffix(".json").write_text(json.dumps(made_with), encoding="utf-8")
    assert evaluates(made, model, made_with)
    assert not evaluates(made, model, {**made_with, "settings": {"GRPO_FEW_SHOT": "1"}})  # another prompt
    (model / "adapter_model.safetensors").write_bytes(b"retrained")  # the arm trained again
    assert not evaluates(made, model, made_with)
