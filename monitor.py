"""Run health, live: a callback that judges the run's metrics at every logging step by the bands of
health_bands.py (the profile GRPO_MONITOR_BANDS names) and writes a line into learning.log when a check turns
bad or recovers, and one that drops an optimizer step whose gradient is not finite. analyze.py reads the same
bands, so the live monitor and the written report cannot disagree about a band.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from health_bands import EVAL_PASS, RELATIVE, Check, Knobs, Profile, Rows, last_epoch, recent

RECOVER_STEPS = 3  # a warning is withdrawn only after this many good judgements in a row, so it cannot flap


class HealthLine(NamedTuple):
    """A line the monitor writes: `text` for learning.log; `level` (warn, or info for a recovery) and `title`
    (what the line is about, as it starts) for the dashboard's alert."""

    level: str
    title: str
    text: str


def warning_line(check: Check, epoch: float, steps: int) -> HealthLine:
    # Env changes read as a shell prefix; a command to run comes after them, never among them.
    settings = [change for change, _ in check.advice if not change.startswith("python ")]
    commands = [f"run {change}" for change, _ in check.advice if change.startswith("python ")]
    changes = ", then ".join(part for part in (" ".join(settings), *commands) if part)
    text = (
        f"WARNING [Epoch {epoch:.2f}] {check.headline()} over {_over(check, steps)} "
        f"(expected {check.band}): {check.meaning}." + (f" Try {changes}" if changes else "")
    )
    return HealthLine("warn", check.headline(), text)


def ok_line(check: Check, epoch: float, steps: int) -> HealthLine:
    text = f"OK [Epoch {epoch:.2f}] {check.headline()} over {_over(check, steps)}, back within {check.band}"
    return HealthLine("info", check.headline(), text)


def _over(check: Check, steps: int) -> str:
    return check.span or f"the last {steps} steps"


def knobs_of(args: TrainingArguments) -> Knobs:
    """The knobs of a GRPOConfig; settings it does not carry keep the seed's values."""
    return Knobs(
        temperature=getattr(args, "temperature", Knobs.temperature),
        num_generations=getattr(args, "num_generations", Knobs.num_generations),
        learning_rate=getattr(args, "learning_rate", Knobs.learning_rate),
        max_completion=getattr(args, "max_completion_length", Knobs.max_completion) or Knobs.max_completion,
    )


def numeric(row: Mapping[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in row.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


def one_per_step(rows: Iterable[dict[str, float]]) -> Rows:
    """The rows in step order, each step once. A row replaces every earlier row at its step or later: after
    --resume from checkpoint-N the run logs again from step N+1, and whatever the killed run logged past N
    came from a stretch of training that the resumed run redoes."""
    kept: Rows = []
    for row in rows:
        while kept and kept[-1]["step"] >= row["step"]:
            kept.pop()
        kept.append(row)
    return kept


def metric_history(rows: Iterable[Mapping[str, Any]]) -> tuple[Rows, Rows]:
    """metrics.jsonl's rows as (training steps, held-out evaluations), each step once; other log events
    (the end-of-training summary) are left out."""
    stepped = [r for r in map(numeric, rows) if "step" in r]
    evals = one_per_step(r for r in stepped if EVAL_PASS in r)
    return one_per_step(r for r in stepped if "reward" in r), evals


class HealthMonitor(TrainerCallback):
    """Judges the recent window at every logging step and writes one line when a check turns bad or
    recovers, by the bands of `profile`; with `stop_on_red_flags` it saves and stops once the profile's stop
    criteria hold (the relative bands' at any epoch, the seed's from epoch 1.0). `add_eval` judges
    memorising at every held-out evaluation.

    A resumed run passes `earlier`, the rows of metrics.jsonl: the history then starts with the steps up to
    the checkpoint, each once, so the window and the trend span the resume. The checks already bad there are
    written again at the start: the resumed run's header cuts a reader of learning.log off from the earlier
    warnings, and an OK line later would otherwise recover from a warning nobody sees above it."""

    def __init__(
        self,
        write_line: Callable[[str], None],
        stop_on_red_flags: bool,
        earlier: Sequence[Mapping[str, Any]] = (),
        alert: Callable[[str, str, str], None] | None = None,
        profile: Profile = RELATIVE,
    ) -> None:
        self.write_line = write_line
        self.profile = profile
        self.alert = alert  # gets each line's level, title and text too (the dashboard's alerts)
        self.stop_on_red_flags = stop_on_red_flags
        self.earlier = earlier
        self.knobs = Knobs()
        self.history: Rows = []
        self.evals: Rows = []
        self.bad: dict[str, bool] = {}
        self.good_streak: dict[str, int] = {}
        self.stop_reported = False

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs
    ) -> None:
        # global_step is the checkpoint's step here: rows past it are the stretch the resumed run redoes.
        self.knobs = knobs_of(args)
        history, evals = metric_history(self.earlier)
        self.history = [r for r in history if r["step"] <= state.global_step]
        self.evals = [e for e in evals if e["step"] <= state.global_step]
        checks = self.profile.run_checks(self.history, self.knobs)
        lines = self._transitions(
            [*checks, *self.profile.run_eval_checks(self.history, self.evals, self.knobs)]
        )
        if state.is_world_process_zero:
            self._write(lines)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs,
    ) -> None:
        if not logs or "reward" not in logs:  # the end-of-training summary and eval logs carry no reward
            return
        row = numeric(logs) | {"step": float(state.global_step)}
        row.setdefault("epoch", float(state.epoch or 0.0))
        self.history.append(row)
        lines = self._transitions(self.profile.run_checks(self.history, self.knobs))
        criteria = self.profile.criteria(self.history, None, None)
        if self.profile.should_stop(self.history, criteria) and not self.stop_reported:
            self.stop_reported = True
            red = "; ".join(f"{c.name} ({c.evidence})" for c in criteria if c.holds)
            action = (
                "stopping, checkpoint saved" if self.stop_on_red_flags else "--stop-on-red-flags would stop"
            )
            text = f"WARNING [Epoch {last_epoch(self.history):.2f}] stop criteria hold: {red}; {action}"
            lines.append(HealthLine("warn", "stop criteria hold", text))
            if self.stop_on_red_flags:
                control.should_save = True
                control.should_training_stop = True
        # Every process judges (so all stop together); only the main one writes.
        if state.is_world_process_zero:
            self._write(lines)

    def add_eval(self, row: Mapping[str, Any]) -> None:
        """One held-out evaluation, as its metrics.jsonl row (step, epoch, eval/pass@1, eval/reward, ...):
        writes a line when an evaluation's check (memorising; with the relative bands, held-out progress too)
        turns bad or recovers."""
        self.evals = one_per_step([*self.evals, numeric(row)])
        self._write(self._transitions(self.profile.run_eval_checks(self.history, self.evals, self.knobs)))

    def _write(self, lines: Sequence[HealthLine]) -> None:
        for line in lines:
            self.write_line(line.text)
            if self.alert:
                self.alert(line.level, line.title, line.text)

    def _transitions(self, checks: Sequence[Check]) -> list[HealthLine]:
        epoch, steps = last_epoch(self.history), len(recent(self.history))
        lines = []
        for check in checks:
            if check.ok is None:
                continue
            if not check.ok:
                self.good_streak[check.name] = 0
                if not self.bad.get(check.name):
                    self.bad[check.name] = True
                    lines.append(warning_line(check, epoch, steps))
            elif self.bad.get(check.name):
                self.good_streak[check.name] = self.good_streak.get(check.name, 0) + 1
                if self.good_streak[check.name] >= RECOVER_STEPS:
                    self.bad[check.name] = False
                    lines.append(ok_line(check, epoch, steps))
        return lines


class SkipNonFiniteUpdates(TrainerCallback):
    """Drops an optimizer step whose gradient holds a nan or an inf, and says so in learning.log.

    The one failure a warning cannot wait for: clipping a non-finite gradient makes every gradient nan, the
    optimizer writes nan into every trained weight, and the next sampling stops the run (CUDA: "probability
    tensor contains either inf, nan or element < 0"). Without its gradients the optimizer leaves the weights
    and its state as they were, as a mixed-precision loss scaler does on an overflow; the schedule goes on.
    After an all-reduce every process holds the same gradients, so all of them skip together."""

    def __init__(self, write_line: Callable[[str], None]) -> None:
        self.write_line = write_line
        self.skipped = 0

    def on_pre_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, model=None, **kwargs
    ) -> None:
        import torch

        grads = [p.grad for p in model.parameters() if p.grad is not None]
        if not grads or bool(torch.nn.utils.get_total_norm(grads).isfinite()):
            return
        for parameter in model.parameters():
            parameter.grad = None
        self.skipped += 1
        if state.is_world_process_zero:
            slower = knobs_of(args).slower()
            self.write_line(
                f"WARNING [Epoch {state.epoch or 0.0:.2f}] step {state.global_step + 1}: the gradient is not "
                f"finite (nan or inf), so this update was skipped and the weights are unchanged "
                f"({self.skipped} skipped so far)." + (f" If it repeats, try {slower}" if slower else "")
            )
