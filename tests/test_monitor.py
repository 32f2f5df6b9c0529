"""The health checks of both profiles (the seed's absolute bands, the default relative ones), and
HealthMonitor inside callbacks and a real GRPO run; tests/test_run_health.py runs real logs through both."""

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from transformers import TrainerCallback, TrainerControl, TrainerState

import health_bands as bands
import monitor
from health_bands import RELATIVE, SEED, Knobs, Profile
from monitor import HealthMonitor

if TYPE_CHECKING:
    from trl import GRPOTrainer

# The seed's six log lines at epoch 0.28-0.29, as TRL names the metrics.
SEED_LINES = [
    (0.28, 0.0838, 0.102, 0.077, 0.155, 0.00),
    (0.28, 0.0362, 0.066, 0.072, 0.090, 0.00),
    (0.29, 0.0406, 0.115, 0.065, 0.165, 0.25),
    (0.29, 0.0317, 0.084, 0.063, 0.078, 0.25),
    (0.29, 0.0286, 0.073, 0.044, 0.103, 0.50),
    (0.29, 0.0380, 0.113, 0.066, 0.110, 0.25),
]
SEED_ROWS = [
    {"epoch": e, "grad_norm": g, "reward": r, "reward_std": s, "entropy": h, "frac_reward_zero_std": f}
    for e, g, r, s, h, f in SEED_LINES
]


def row(epoch: float, reward: float, frac: float, entropy: float = 0.15, grad: float = 0.05) -> dict:
    return {
        "epoch": epoch,
        "reward": reward,
        "reward_std": 0.2 * reward,
        "frac_reward_zero_std": frac,
        "entropy": entropy,
        "grad_norm": grad,
        "loss": 0.01,
    }


def healthy(steps: int = 40, end: float = 1.0) -> list[dict]:
    """Reward 0.05 -> 0.55 while frac_zero_std falls 0.4 -> 0, the seed's healthy trajectory."""
    return [
        row(end * i / steps, 0.05 + 0.5 * i / steps, 0.4 * (1 - i / steps) ** 3) for i in range(1, steps + 1)
    ]


def collapsed(steps: int = 40, end: float = 1.0) -> list[dict]:
    return [row(end * i / steps, 0.08, 0.5, entropy=0.05, grad=0.005) for i in range(1, steps + 1)]


def failing(checks) -> set[str]:
    return {c.name for c in checks if c.ok is False}


def test_reward_floor_follows_the_seed_milestones() -> None:
    assert bands.reward_floor(0.0) == 0.0
    assert bands.reward_floor(0.5) == pytest.approx(0.20)
    assert bands.reward_floor(0.25) == pytest.approx(0.10)
    assert bands.reward_floor(0.75) == pytest.approx(0.275)
    assert bands.reward_floor(1.0) == pytest.approx(0.35)
    assert bands.reward_floor(3.0) == pytest.approx(0.35)


def test_advice_from_the_seed_values_is_the_seed_advice() -> None:
    knobs = Knobs()
    assert [knobs.hotter(), knobs.more_generations(), knobs.faster(), knobs.longer()] == [
        "GRPO_TEMPERATURE=1.1",
        "GRPO_NUM_GENERATIONS=8",
        "GRPO_LEARNING_RATE=8e-6",
        "GRPO_MAX_COMPLETION=600",
    ]
    assert knobs.shorter_gate() == "MIN_NON_EMPTY_LINES=4"


def test_advice_steps_on_from_values_already_applied() -> None:
    knobs = Knobs(temperature=1.1, num_generations=8, learning_rate=8e-6, max_completion=600)
    assert knobs.hotter() == "GRPO_TEMPERATURE=1.3"
    assert knobs.more_generations() == "GRPO_NUM_GENERATIONS=10"
    assert knobs.faster() == "GRPO_LEARNING_RATE=1.3e-5"
    assert knobs.longer() == "GRPO_MAX_COMPLETION=700"
    assert Knobs(temperature=1.5).hotter() == "GRPO_TEMPERATURE=1.5"


def test_the_seed_window_fails_exactly_the_checks_the_seed_flagged() -> None:
    checks = {c.name: c for c in SEED.run_checks(SEED_ROWS)}
    assert failing(checks.values()) == {"frac_zero_std", "reward_level", "reward_cv", "entropy_swing"}
    assert checks["frac_zero_std"].value == pytest.approx(1.25 / 6)
    assert checks["reward_cv"].value == pytest.approx(0.387 / 0.553, rel=1e-3)
    assert checks["entropy_swing"].value == pytest.approx(0.165 - 0.078)
    assert checks["clipped"].ok is None  # learning.log does not carry it: not judged


def test_healthy_end_passes_every_check_and_collapse_fails_the_core_ones() -> None:
    assert failing(SEED.run_checks(healthy())) == set()
    assert {"frac_zero_std", "reward_level", "entropy_low", "grad_norm_low"} <= failing(
        SEED.run_checks(collapsed())
    )


def lora_run(steps: int = 20, **late) -> list[dict]:
    """A real 0.5B LoRA run's levels (the learning bench: entropy 0.5, grad_norm 1.5 on every step), with
    `late` changing row() arguments for the last 10 steps."""
    return [
        row(i / 40, **({"reward": 0.2, "frac": 0.0, "entropy": 0.5, "grad": 1.5} | (late if i > 10 else {})))
        for i in range(1, steps + 1)
    ]


def test_relative_bands_judge_change_against_the_runs_own_start() -> None:
    assert failing(RELATIVE.run_checks(lora_run())) == set()
    assert {"entropy_high", "grad_norm"} <= failing(SEED.run_checks(lora_run()))
    assert failing(RELATIVE.run_checks(lora_run(entropy=0.2))) == {"entropy_fall"}  # under half of 0.5
    assert failing(RELATIVE.run_checks(lora_run(entropy=0.3))) == set()
    assert failing(RELATIVE.run_checks(lora_run(frac=0.5))) == {"tied_rise"}
    assert failing(RELATIVE.run_checks(lora_run(frac=0.25))) == set()
    spike = lora_run()
    spike[-1]["grad_norm"] = 16.0  # over 10 x the median 1.5
    checks = {c.name: c for c in RELATIVE.run_checks(spike)}
    assert failing(checks.values()) == {"grad_jump"} and checks["grad_jump"].limit == pytest.approx(15.0)
    assert checks["grad_jump"].band == "<= 10 x the run's median 1.5"


def test_a_flat_reward_counts_only_while_completions_hit_the_length_limit() -> None:
    clipped = [r | {"completions/clipped_ratio": 0.3} for r in lora_run()]
    assert failing(RELATIVE.run_checks(clipped)) == {"reward_stalled"}
    rising = [r | {"reward": 0.1 + r["epoch"]} for r in clipped]
    assert failing(RELATIVE.run_checks(rising)) == set()
    assert {c.name: c.ok for c in RELATIVE.run_checks(lora_run())}["reward_stalled"] is None  # not logged


def issue_collapse(steps: int = 40) -> list[dict]:
    """The collapse of issue 36's log: every group tied at 0.050, grad_norm 0, entropy 0.54 -> 0.10 over 40
    steps (epoch 0.40)."""
    return [
        row(i / 100, 0.05, 1.0, entropy=0.54 - 0.44 * (i - 1) / (steps - 1), grad=0.0) | {"reward_std": 0.0}
        for i in range(1, steps + 1)
    ]


def test_a_total_collapse_stops_as_soon_as_it_is_unmistakable_not_at_epoch_one() -> None:
    rows = issue_collapse()
    assert SEED.verdict(rows, SEED.run_checks(rows), SEED.criteria(rows, None, None)) == ("yellow", "adjust")
    first = rows[: bands.COLLAPSE_STEPS]
    assert RELATIVE.verdict(first, [], RELATIVE.criteria(first, None, None)) == ("red", "stop")
    assert RELATIVE.verdict(first[:-1], [], RELATIVE.criteria(first[:-1], None, None)) == (
        "yellow",
        "continue",
    )
    lines, control = replay(rows, stop=True, profile=RELATIVE)
    assert control.should_training_stop and control.should_save
    assert lines == [
        "WARNING [Epoch 0.05] stop criteria hold: every group tied for 5 steps, nothing learned (tied share "
        "1 on the last 5 steps, grad_norm at most 0, mean reward 0.05 against 0.05 over the first 5); "
        "stopping, checkpoint saved"
    ]


def test_groups_that_tie_because_the_run_learned_are_no_collapse() -> None:
    """Every group tied on 5 steps, but at a reward far above the run's start: the training problems are
    solved (learning.log does not say so per group; metrics.jsonl's groups/solved does)."""
    rows = [row(i / 10, 0.1, 0.0) for i in range(1, 11)] + [row(1 + i / 10, 1.0, 1.0) for i in range(1, 6)]
    assert not any(c.holds for c in RELATIVE.criteria(rows, None, None))


def test_no_advice_lowers_a_lora_learning_rate_below_5e_5() -> None:
    assert bands.LORA_LR_FLOOR == 5e-5
    assert Knobs(learning_rate=5e-5).slower() == "" and Knobs(learning_rate=5e-6).slower() == ""
    assert Knobs(learning_rate=8e-5).slower() == "GRPO_LEARNING_RATE=5e-5"
    assert Knobs(learning_rate=2e-4).slower() == "GRPO_LEARNING_RATE=1e-4"
    spike = lora_run()
    spike[-1]["grad_norm"] = 16.0
    for profile in (SEED, RELATIVE):
        checks = profile.run_checks(spike, Knobs(learning_rate=5e-5))
        rates = [float(a.split("=")[1]) for c in checks for a, _ in c.advice if a.startswith("GRPO_LEARNING")]
        assert all(rate > 5e-5 for rate in rates), (profile.name, rates)  # the seed's "faster" only


def test_too_few_steps_are_not_judged() -> None:
    assert SEED.run_checks(SEED_ROWS[:4]) == []
    assert SEED.verdict(SEED_ROWS[:4], [], []) == ("yellow", "continue")


def test_stop_criteria_at_epoch_one() -> None:
    history = collapsed()
    criteria = {c.name: c.holds for c in SEED.criteria(history, test_pass_share=0.0)}
    assert criteria["mean reward < 0.15"] and criteria["frac_zero_std > 0.3"] and criteria["no test passes"]
    assert criteria["completions are gibberish"] is None
    assert SEED.should_stop(history, SEED.criteria(history, None, None))
    # The same collapse before epoch 1.0 is not yet a reason to stop.
    early = collapsed(end=0.9)
    assert not SEED.should_stop(early, SEED.criteria(early, None, None))
    assert not any(c.holds for c in SEED.criteria(healthy(), test_pass_share=0.2, gibberish_share=0.0))


def test_reward_trend_is_the_least_squares_slope() -> None:
    assert bands.reward_trend(healthy()) == pytest.approx(0.5, rel=0.05)
    assert bands.reward_trend(collapsed()) == pytest.approx(0.0, abs=1e-9)
    assert bands.reward_trend(SEED_ROWS) is None  # 0.01 epoch: a slope there is noise


def test_gibberish_is_random_tokens_not_short_code() -> None:
    assert not bands.looks_like_gibberish("let f x = x + 1\n(* END *)")
    assert bands.looks_like_gibberish(" raises <> Coin\x1f\ufffd\ufffd left nc falseObjcond")
    assert bands.looks_like_gibberish("")
    assert bands.looks_like_gibberish("数组 长度 " * 10 + "let")


class Args:
    """The knobs HealthMonitor reads from GRPOConfig."""

    temperature, num_generations, learning_rate, max_completion_length = 0.9, 6, 5e-6, 512


def replay(
    rows: list[dict], stop: bool = False, main: bool = True, profile: Profile = SEED
) -> tuple[list[str], TrainerControl]:
    lines: list[str] = []
    health = HealthMonitor(lines.append, stop_on_red_flags=stop, profile=profile)
    state = TrainerState(is_world_process_zero=main)
    control = TrainerControl()
    health.on_train_begin(Args(), state, control)
    for r in rows:
        state.epoch = r["epoch"]
        state.global_step += 1
        health.on_log(Args(), state, control, logs=dict(r))
        if control.should_training_stop:
            break
    return lines, control


def test_monitor_warns_once_when_a_check_turns_bad_and_once_when_it_recovers() -> None:
    rows = collapsed(steps=15, end=0.3) + [row(0.3 + 0.01 * i, 0.3, 0.0) for i in range(1, 31)]
    lines, _ = replay(rows)
    frac = [line for line in lines if "frac_zero_std=" in line]
    assert len(frac) == 2
    assert frac[0].startswith("WARNING [Epoch 0.10] frac_zero_std=0.5 over the last")
    assert "(expected < 0.10)" in frac[0]
    assert "Try GRPO_TEMPERATURE=1.1 GRPO_NUM_GENERATIONS=8" in frac[0]
    assert frac[1].startswith("OK [Epoch") and "back within < 0.10" in frac[1]
    assert all(line.startswith(("WARNING [Epoch", "OK [Epoch")) for line in lines)


def test_monitor_judges_nothing_before_enough_steps_and_ignores_summaries() -> None:
    lines, _ = replay(collapsed(steps=bands.MIN_STEPS - 1))
    assert lines == []
    health = HealthMonitor(lines.append, stop_on_red_flags=True)
    health.on_log(Args(), TrainerState(), TrainerControl(), logs={"train_runtime": 3.0, "epoch": 1.0})
    assert health.history == [] and lines == []


def test_monitor_stops_a_collapsed_run_at_epoch_one_with_a_checkpoint() -> None:
    lines, control = replay(collapsed(steps=40, end=2.0), stop=True)
    assert control.should_training_stop and control.should_save
    assert lines[-1].startswith("WARNING [Epoch 1.00] stop criteria hold: mean reward < 0.15")
    assert lines[-1].endswith("stopping, checkpoint saved")


def test_monitor_without_the_flag_only_says_it_would_stop() -> None:
    lines, control = replay(collapsed(steps=40, end=2.0), stop=False)
    assert not control.should_training_stop and not control.should_save
    assert sum("stop criteria hold" in line for line in lines) == 1
    assert any(line.endswith("--stop-on-red-flags would stop") for line in lines)


def test_monitor_leaves_a_healthy_run_alone() -> None:
    lines, control = replay(healthy(steps=40, end=2.0), stop=True)
    assert not control.should_training_stop
    assert not any("stop criteria" in line for line in lines)


def test_only_the_main_process_writes_but_every_process_stops() -> None:
    lines, control = replay(collapsed(steps=40, end=2.0), stop=True, main=False)
    assert lines == [] and control.should_training_stop


def tiny_grpo_trainer(
    model_dir: Path,
    output_dir: Path,
    reward: Callable[..., list[float]],
    callbacks: list[TrainerCallback],
    **config,
) -> "GRPOTrainer":
    """Real TRL on the CPU, as this file's real runs use it: the tiny model on 8 prompts, groups of 4
    completions of up to 8 tokens, a log line every step. `config` is the rest of GRPOConfig (how long the
    run is, what it saves), which is what those runs differ in."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(output_dir),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        bf16=False,
        **config,
    )
    return GRPOTrainer(
        model=str(model_dir),
        reward_funcs=[reward],
        args=args,
        train_dataset=Dataset.from_list([{"prompt": f"let f{i} x ="} for i in range(8)]),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        callbacks=callbacks,
    )


@pytest.mark.parametrize(("profile", "stop_step"), [(SEED, 8), (RELATIVE, bands.COLLAPSE_STEPS)], ids=str)
def test_monitor_in_a_real_grpo_run_stops_a_total_collapse(
    tmp_path: Path, profile: Profile, stop_step
) -> None:
    """A constant reward is total mode collapse: the seed's bands warn and stop a 3-epoch run at epoch 1.0
    (step 8), the relative bands as soon as every group has tied for 5 steps."""
    from demo import build_tiny_model

    def constant_reward(completions, **kwargs) -> list[float]:
        return [0.05] * len(completions)

    lines: list[str] = []
    trainer = tiny_grpo_trainer(
        build_tiny_model(tmp_path / "tiny"),
        tmp_path / "run",
        constant_reward,
        [HealthMonitor(lines.append, stop_on_red_flags=True, profile=profile)],
        num_train_epochs=3,
        save_strategy="no",
    )
    trainer.train()
    if profile is SEED:
        assert any(line.startswith("WARNING") and "frac_zero_std=1 " in line for line in lines), lines
    else:
        assert lines[-1].startswith(
            "WARNING [Epoch 0.62] stop criteria hold: every group tied for 5 steps, "
            "nothing learned (tied share 1 on the last 5 steps, grad_norm at most 0,"
        )
    assert "stop criteria hold" in lines[-1] and lines[-1].endswith("checkpoint saved")
    assert trainer.state.global_step == stop_step
    assert list((tmp_path / "run").glob("checkpoint-*")), "the stop must leave a checkpoint"


def test_random_samples_point_at_the_base_model_not_a_hotter_sampler() -> None:
    """A model that samples noise (the demo's random model: entropy 7.6) ties because nothing scores."""
    noise = [row(0.01 * i, 0.0, 1.0, entropy=7.6, grad=0.0) for i in range(1, 11)]
    checks = {c.name: c for c in SEED.run_checks(noise)}
    changes = [change for c in checks.values() if c.ok is False for change, _ in c.advice]
    assert "python test_base_model.py" in changes and "GRPO_TEMPERATURE=0.8" in changes
    assert "GRPO_TEMPERATURE=1.1" not in changes
    # The command comes after the settings, so that the line never reads as the script's arguments.
    line = monitor.warning_line(checks["frac_zero_std"], 0.1, 10).text
    assert line.endswith("Try GRPO_NUM_GENERATIONS=8, then run python test_base_model.py")


def evals(pass1, reward, epochs=(0.2, 0.4, 0.6, 0.8, 1.0)) -> list[dict]:
    """Held-out evaluations as train.py writes them to metrics.jsonl (40 steps per epoch)."""
    return [
        {
            "step": round(40 * e),
            "epoch": e,
            "eval/problems": 40,
            "eval/pass@1": pass1(e),
            "eval/reward": reward(e),
        }
        for e in epochs
    ]


def test_one_per_step_lets_the_later_row_win_and_drops_the_stretch_the_resume_redoes() -> None:
    killed = [{"step": s, "run": 1} for s in range(1, 14)]
    resumed = [{"step": s, "run": 2} for s in (11, 12)]  # from checkpoint-10, not yet at step 13
    kept = monitor.one_per_step([*killed, *resumed])
    assert [(r["step"], r["run"]) for r in kept] == [(s, 1) for s in range(1, 11)] + [(11, 2), (12, 2)]


def test_metric_history_splits_steps_from_evaluations_and_leaves_other_events_out() -> None:
    steps = [{"step": i, **row(i / 40, 0.2, 0.0)} for i in range(1, 5)]
    rows = [
        *steps,
        *evals(lambda e: 0.1, lambda e: 0.2, (0.05,)),
        {"step": 4, "train_runtime": 3.0},
        {"reward": 1},
    ]
    history, found = monitor.metric_history([*rows, {"step": 2, **row(0.05, 0.4, 0.0)}])
    assert [(r["step"], r["reward"]) for r in history] == [(1, 0.2), (2, 0.4)]
    assert [(e["step"], e["eval/pass@1"]) for e in found] == [(2, 0.1)]


def test_a_resumed_monitor_starts_from_the_steps_before_its_checkpoint_and_warns_again() -> None:
    """Killed at step 13 with mode collapse, resumed from checkpoint-10; the collapse then clears."""
    killed = [{"step": i, **row(i / 40, 0.3, 0.5)} for i in range(1, 14)]
    killed += evals(lambda e: 0.1, lambda e: 0.2, (0.2, 0.3))  # steps 8 and 12
    lines: list[str] = []
    health = HealthMonitor(lines.append, stop_on_red_flags=False, earlier=killed, profile=SEED)
    state = TrainerState(global_step=10, epoch=0.25, is_world_process_zero=True)
    health.on_train_begin(Args(), state, TrainerControl())
    assert [r["step"] for r in health.history] == list(range(1, 11))
    assert [e["step"] for e in health.evals] == [8]
    assert lines == [
        "WARNING [Epoch 0.25] frac_zero_std=0.5 over the last 10 steps (expected < 0.10): groups whose "
        "completions all score the same give GRPO no learning signal. Try GRPO_TEMPERATURE=1.1 "
        "GRPO_NUM_GENERATIONS=8"
    ]
    for i in range(11, 31):
        state.global_step, state.epoch = i, i / 40
        health.on_log(Args(), state, TrainerControl(), logs=row(i / 40, 0.3, 0.0))
    assert [r["step"] for r in health.history] == list(range(1, 31))
    assert len(lines) == 2 and lines[1].startswith("OK [Epoch") and "frac_zero_std=" in lines[1]


def test_a_fresh_monitor_ignores_rows_past_its_start() -> None:
    lines: list[str] = []
    health = HealthMonitor(lines.append, stop_on_red_flags=False, earlier=[{"step": 1, **row(0.1, 0.1, 1.0)}])
    health.on_train_begin(Args(), TrainerState(), TrainerControl())
    assert health.history == [] and lines == []


def gained(g: float):
    """pass@1 (or eval reward) rising by g over the evaluations at epoch 0.2-1.0."""
    return lambda e: 0.1 + g * (e - 0.2) / 0.8


@pytest.mark.parametrize(
    ("history", "pass1", "reward", "ok"),
    [
        (healthy(), gained(0.0), gained(0.0), False),  # training reward +0.4, held-out flat
        (healthy(), gained(0.04), gained(0.0), False),  # less than two of 40 problems more
        (healthy(), gained(0.06), gained(0.0), True),
        (
            healthy(),
            gained(0.0),
            gained(0.25),
            True,
        ),  # eval reward keeps half the pace: learning, no passes yet
        (healthy(), gained(0.0), gained(0.15), False),
        (collapsed(), gained(0.0), gained(0.0), True),  # nothing rises: other checks speak
    ],
)
def test_memorising_is_training_reward_rising_while_eval_pass_at_1_stays_flat(
    history, pass1, reward, ok
) -> None:
    check = bands.check_memorising(history, evals(pass1, reward), Knobs())
    assert check.ok is ok, check
    assert check.span == "5 evaluations at epoch 0.20-1.00"
    assert check.advice == ()  # the seed's 5e-6 is below LORA_LR_FLOOR already: no lower rate is advised
    assert bands.check_memorising(history, evals(pass1, reward), Knobs(learning_rate=2e-4)).advice[0][0] == (
        "GRPO_LEARNING_RATE=1e-4"
    )


def flat_training(steps: int = 40) -> list[dict]:
    """A training reward that goes nowhere, as a random reward's control would: noise around 0.2."""
    return [row(i / steps, 0.2 + (0.03 if i % 2 else -0.03), 0.0) for i in range(1, steps + 1)]


@pytest.mark.parametrize(
    ("history", "pass1", "reward", "ok"),
    [
        (flat_training(), gained(0.0), gained(0.0), False),  # nothing moves: no progress
        (flat_training(), gained(0.0), gained(0.02), False),  # under the 0.03 the bench's idle arms reached
        (flat_training(), gained(0.06), gained(0.0), True),  # three more held-out problems pass
        (flat_training(), gained(0.0), gained(0.05), True),  # held-out answers score higher
        (healthy(), gained(0.0), gained(0.0), True),  # the training reward climbs: memorising speaks instead
    ],
)
def test_no_held_out_progress_is_judged_by_the_relative_bands_only(history, pass1, reward, ok) -> None:
    checks = {c.name: c for c in RELATIVE.run_eval_checks(history, evals(pass1, reward), Knobs())}
    assert checks["heldout_stalled"].ok is ok, checks["heldout_stalled"]
    assert [c.name for c in SEED.run_eval_checks(history, evals(pass1, reward), Knobs())] == ["memorising"]


def test_memorising_needs_three_evaluations_over_a_fifth_of_an_epoch() -> None:
    flat = gained(0.0)
    assert bands.check_memorising(healthy(), evals(flat, flat)[:2], Knobs()).ok is None
    assert bands.check_memorising(healthy(), evals(flat, flat, (0.85, 0.9, 0.95, 1.0)), Knobs()).ok is None
    assert bands.check_memorising(healthy(), [], Knobs()).value is None


def test_monitor_warns_live_once_when_evaluations_show_memorising() -> None:
    lines: list[str] = []
    health = HealthMonitor(lines.append, stop_on_red_flags=False)
    state = TrainerState(is_world_process_zero=True)
    control = TrainerControl()
    health.on_train_begin(Args(), state, control)
    flat = evals(gained(0.0), gained(0.0))
    for i, r in enumerate(healthy(steps=40), 1):
        state.global_step, state.epoch = i, r["epoch"]
        health.on_log(Args(), state, control, logs=dict(r))
        for e in flat:
            if e["step"] == i:
                health.add_eval(e)
    memorising = [line for line in lines if "eval pass@1 gain" in line]
    assert len(memorising) == 1, lines
    assert memorising[0].startswith(
        "WARNING [Epoch 0.60] eval pass@1 gain=0 over 3 evaluations at epoch 0.20-0.60 (expected >= 0.05 "
        "when the training reward gains > 0.10 (here 0.2) and the eval reward less than half as much "
        "(here 0)): "
    )
    assert memorising[0].endswith("keep the checkpoint with the best eval pass@1 rather than the last.")


def test_a_flat_held_out_line_reads_gain_0_whatever_the_sign_of_its_rounding() -> None:
    """pass@1 flat but for the last bit of one value: the least-squares gain is about -1e-17, which rounds to
    -0.0 (what another box's arithmetic gave on a line flat to the eye). The check and its line say 0."""
    flat = evals(gained(0.0), gained(0.0))
    flat[-1]["eval/pass@1"] = math.nextafter(flat[-1]["eval/pass@1"], 0.0)  # 0.1 less one bit
    check = bands.check_memorising(healthy(), flat[-3:], Knobs())
    assert check.value == 0.0 and math.copysign(1.0, check.value) == 1.0
    assert check.ok is False
    line = monitor.warning_line(check, 1.0, 10).text
    assert line.startswith("WARNING [Epoch 1.00] eval pass@1 gain=0 over 3 evaluations") and "-0" not in line


def test_figures_that_round_to_zero_print_unsigned_and_real_negatives_keep_their_sign() -> None:
    assert [bands._num(v) for v in (-0.0, -1e-9, -0.0004, 0.25, None, math.nan)] == [
        "0",
        "-1e-09",  # three significant digits: a value, not a rounded zero
        "-0.0004",
        "0.25",
        "n/a",
        "n/a",
    ]
    flat = [row(i / 40, 0.1, 0.0) for i in range(1, 41)]
    assert SEED.criteria(flat, None, None)[-1].evidence == "reward trend +0.000 per epoch"


def test_steps_that_trained_no_group_log_no_entropy_and_no_check_reads_that_as_a_collapse() -> None:
    """Where dynamic sampling drops every group of a step, TRL logs the entropy as NaN (its mean over no
    tokens) or not at all: those steps have no entropy, and the checks judge the others."""
    rows = healthy(steps=40)
    for i in range(0, 40, 3):
        rows[i]["entropy"] = math.nan
    del rows[1]["entropy"]
    lines, control = replay(rows, stop=True)
    assert not any("entropy" in line for line in lines), lines
    assert not control.should_training_stop
    every_step_dropped = [r | {"entropy": math.nan, "step": i} for i, r in enumerate(healthy(steps=40), 1)]
    checks = {c.name: c for c in SEED.run_checks(monitor.metric_history(every_step_dropped)[0])}
    assert [checks[name].ok for name in ("entropy_low", "entropy_high", "entropy_swing")] == [None] * 3


def test_a_resumed_grpo_run_gives_the_monitor_each_step_once(tmp_path: Path, tiny_model: Path) -> None:
    """Real TRL: 7 steps with checkpoint-5 (as if killed at step 7), then --resume from checkpoint-5 to step 9
    with a new monitor given the first run's log events, as train.py reads them back from metrics.jsonl."""
    log: list[str] = []  # learning.log in short: the step lines and the monitors' lines, in order
    events: list[dict] = []  # metrics.jsonl

    class Events(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            events.append({"step": state.global_step, **logs})
            log.append(f"step {state.global_step}")

    def train(steps: int, reward: float, health: HealthMonitor, resume: str | None) -> None:
        def constant_reward(completions, **kwargs) -> list[float]:
            return [reward] * len(completions)

        trainer = tiny_grpo_trainer(
            tiny_model, tmp_path, constant_reward, [Events(), health], max_steps=steps, save_steps=5
        )
        trainer.train(resume_from_checkpoint=resume)

    train(7, 0.1, HealthMonitor(log.append, stop_on_red_flags=False, profile=SEED), None)
    resumed = HealthMonitor(log.append, stop_on_red_flags=False, earlier=list(events), profile=SEED)
    train(9, 0.3, resumed, str(tmp_path / "checkpoint-5"))
    assert [e["step"] for e in events if "reward" in e] == [1, 2, 3, 4, 5, 6, 7, 6, 7, 8, 9]
    assert [r["step"] for r in resumed.history] == list(range(1, 10))
    assert [r["reward"] for r in resumed.history] == pytest.approx([0.1] * 5 + [0.3] * 4)
    # The collapse is written again when the resumed run starts, before its first step.
    second_run = log[log.index("step 7") + 1 :]
    again = next(
        i for i, line in enumerate(second_run) if line.startswith("WARNING") and "frac_zero_std=1 " in line
    )
    assert again < second_run.index("step 6")


@pytest.mark.parametrize("poison", [math.nan, math.inf])
def test_a_non_finite_gradient_skips_its_update_and_says_so(poison: float, tmp_path: Path) -> None:
    """A step whose gradient holds a nan or inf leaves the weights and AdamW's state as they were (on a GPU
    it otherwise made every weight nan and the next sampling stopped the demo); a finite one goes through."""
    import torch
    from transformers import TrainingArguments

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    args = TrainingArguments(output_dir=str(tmp_path), learning_rate=3e-3, report_to="none")
    state, lines = TrainerState(epoch=0.5, global_step=7), []
    guard = monitor.SkipNonFiniteUpdates(lines.append)

    def step(poisoned: bool) -> None:
        model(torch.ones(2, 4)).sum().backward()
        if poisoned:
            model[0].weight.grad[0, 0] = poison
        guard.on_pre_optimizer_step(args, state, TrainerControl(), model=model)
        optimizer.step()
        optimizer.zero_grad()

    before = [p.detach().clone() for p in model.parameters()]
    step(poisoned=True)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert not optimizer.state  # AdamW saw no gradient: no moments, no step count
    assert lines == [
        "WARNING [Epoch 0.50] step 8: the gradient is not finite (nan or inf), so this update was skipped "
        "and the weights are unchanged (1 skipped so far). If it repeats, try GRPO_LEARNING_RATE=1.5e-3"
    ]
    step(poisoned=False)
    after = list(model.parameters())
    assert all(torch.isfinite(p).all() and not torch.equal(a, p) for a, p in zip(before, after, strict=True))
    assert len(lines) == 1


def test_a_real_trainer_step_with_an_infinite_gradient_leaves_the_weights_and_says_so(
    tmp_path: Path, tiny_model: Path
) -> None:
    """Real TRL, as train.py wires it: backward puts an inf into one weight's gradient at step 1, the Trainer
    clips (which makes every gradient nan), the guard drops the update; step 2 trains as usual."""
    import torch

    lines: list[str] = []
    weights: dict[int, dict[str, torch.Tensor]] = {}

    class Weights(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            weights[state.global_step] = {n: p.detach().clone() for n, p in model.named_parameters()}

    def length_reward(completions, **kwargs) -> list[float]:  # groups that differ, so that a step learns
        return [len(c) % 5 / 4 for c in completions]

    trainer = tiny_grpo_trainer(
        tiny_model,
        tmp_path,
        length_reward,
        [monitor.SkipNonFiniteUpdates(lines.append), Weights()],
        max_steps=2,
        save_strategy="no",
        learning_rate=1e-2,
    )
    initial = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    poisoned = trainer.model.model.layers[0].mlp.up_proj.weight
    poisoned.register_hook(
        lambda grad: (
            grad.index_fill(0, torch.tensor([0]), math.inf) if trainer.state.global_step == 0 else grad
        )
    )
    trainer.train()

    assert all(torch.equal(initial[n], w) for n, w in weights[1].items())  # step 1: nothing moved
    assert len(lines) == 1 and lines[0].startswith(
        "WARNING [Epoch 0.00] step 1: the gradient is not finite (nan or inf), so this update was skipped"
    ), lines
    moved = [n for n, w in weights[2].items() if not torch.equal(initial[n], w)]
    assert moved and all(torch.isfinite(w).all() for w in weights[2].values())  # step 2 trained
