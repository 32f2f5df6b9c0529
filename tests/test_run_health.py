"""Both run-health profiles on real logs (tests/fixtures/runs/): each fixture's verdicts, the table in
docs/run-health.md that shows them, and what the default must and must not say about them."""

import dataclasses
import re

import pytest

import analyze
from bench.run_health import DOC, FIXTURES, NOT_JUDGED, TABLE, fixture_runs, judge, table
from health_bands import LORA_LR_FLOOR, PROFILES, RELATIVE, SEED
from settings import TrainConfig

REAL_ARMS = (
    "recipe",
    "random-reward",
    "grpo-only",
    "control",
    "sft",
    "lora-lr",
    "gate-1",
    "curriculum",
    "syntax-credit",
    "dynamic",
    "together",
    "envrc",
)
# Per fixture: (relative, seed) as (status, decision, first step not green, first step red).
EXPECTED = {
    **{
        f"real-{arm}": (("green", "continue", None, None), ("yellow", "adjust", 5, None)) for arm in REAL_ARMS
    },
    "seed-analysis": (("green", "continue", None, None), ("yellow", "adjust", 5, None)),
    "collapse-tiny": (("red", "stop", 5, 5), ("yellow", "adjust", 5, None)),
    "collapse-real": (("red", "stop", 5, 5), ("yellow", "adjust", 5, None)),
    "demo-seed-42": (("yellow", "adjust", 17, None), ("yellow", "adjust", 5, None)),
    "demo-seed-1": (("yellow", "adjust", 40, None), ("yellow", "adjust", 5, None)),
    "demo-seed-2": (("yellow", "adjust", 34, None), ("yellow", "adjust", 5, None)),
}


@pytest.fixture(scope="module")
def verdicts() -> dict[str, tuple]:
    runs = {folder.name: analyze.load_run(folder) for folder in fixture_runs()}
    return {name: tuple(judge(run, profile) for profile in (RELATIVE, SEED)) for name, run in runs.items()}


def test_the_profiles_are_the_settings_choices() -> None:
    field = next(f for f in dataclasses.fields(TrainConfig) if f.name == "monitor_bands")
    assert set(field.metadata["choices"]) == set(PROFILES) and field.default == RELATIVE.name


def test_the_fixtures_are_the_real_runs_the_table_promises() -> None:
    names = {folder.name for folder in fixture_runs()}
    assert names == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_fixture_gets_its_verdict_from_both_profiles(verdicts, name: str) -> None:
    got = tuple((v.status, v.decision, v.fired, v.stopped) for v in verdicts[name])
    assert got == EXPECTED[name]


def test_the_demo_ends_on_a_held_out_check_by_default_as_its_held_out_pass_at_1_stays_at_0(verdicts) -> None:
    for seed in (42, 1, 2):
        run = analyze.load_run(FIXTURES / f"demo-seed-{seed}")
        assert max(e["eval/pass@1"] for e in run.evals) == 0.0
        relative, _ = verdicts[f"demo-seed-{seed}"]
        assert {"memorising", "heldout_stalled"} & set(relative.why), (seed, relative)


@pytest.mark.parametrize("name", ["collapse-tiny", "collapse-real"])
def test_the_collapse_is_stopped_by_the_default_at_step_5_and_only_warned_about_by_the_seeds_bands(
    verdicts, name: str
) -> None:
    relative, seed = verdicts[name]
    assert "stop criteria" in relative.first and relative.stopped == 5
    assert seed.stopped is None and "frac_zero_std" in seed.why  # its stop criteria wait for epoch 1.0


def test_the_docs_table_is_the_one_the_fixtures_give() -> None:
    found = TABLE.search(DOC.read_text(encoding="utf-8"))
    assert found, "docs/run-health.md lacks the health-table markers"
    assert found[2] == table(), "regenerate: .venv/bin/python bench/run_health.py --write"
    for name, why in NOT_JUDGED.items():
        assert re.search(rf"^\| {name} \|.*\| {re.escape(why)} \|", found[2], re.M)


def test_the_default_never_advises_a_lora_learning_rate_below_5e_5() -> None:
    for folder in fixture_runs():
        markdown = analyze.analyze(analyze.load_run(folder), RELATIVE).markdown
        rates = [float(r) for r in re.findall(r"GRPO_LEARNING_RATE=([0-9.e+-]+)", markdown)]
        assert all(rate >= LORA_LR_FLOOR for rate in rates), (folder.name, rates)
    lora_lr = analyze.analyze(analyze.load_run(FIXTURES / "real-lora-lr"), SEED).markdown
    assert (
        "GRPO_LEARNING_RATE=2.5e-5" not in lora_lr
    )  # what the seed's bands used to tell the arm that learned
