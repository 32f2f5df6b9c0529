"""Run health: the seed analysis's thresholds as pure checks, and a callback that reports them live.

Every check is a function of the run's metric history (a list of dicts keyed by TRL's metric names:
`reward`, `reward_std`, `entropy`, `frac_reward_zero_std`, `grad_norm`, `completions/clipped_ratio`,
`epoch`, ...). Checks judge the mean of the last WINDOW logging steps, because one GRPO step sees only a
handful of prompts and its metrics are noisy. analyze.py imports the same checks, so the live monitor and
the written report cannot disagree about a band.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from run_records import SAMPLED_ZERO_STD, figure

Row = Mapping[str, float]
Rows = list[dict[str, float]]  # one per logged step, in step order

WINDOW = 10  # logging steps judged together
MIN_STEPS = 5  # fewer logged steps than this and we say so instead of judging
RECOVER_STEPS = 3  # a warning is withdrawn only after this many good judgements in a row, so it cannot flap

# The seed's bands.
FRAC_ZERO_STD_MAX = 0.10
ENTROPY_BAND = (0.10, 0.20)
ENTROPY_SWING_MAX = 0.08  # max - min over the window; the seed's 0.078-0.165 swing is "highly variable"
REWARD_CV_MAX = 0.30  # reward std / reward mean
GRAD_NORM_BAND = (0.01, 0.5)
CLIPPED_MAX = 0.10  # share of completions cut at the length limit (runaways and filibusters)
GATED_MAX = 0.25  # share of completions zeroed by the MIN_NON_EMPTY_LINES gate
# Minimum mean reward, interpolated linearly between the seed's milestones (> 0.20 at 0.5, > 0.35 at 1.0).
REWARD_MILESTONES = ((0.0, 0.0), (0.5, 0.20), (1.0, 0.35))
REWARD_TARGET_AT_HALF = 0.30  # what the seed hoped for at epoch 0.5 before its fixes
TEST_PASS_SHARE_AT_ONE = 0.10  # "regular test passes (10-20% of samples)" at epoch 1.0

# The seed's stop criteria, decided at epoch 1.0.
STOP_EPOCH = 1.0
REWARD_STOP = 0.15
FRAC_ZERO_STD_STOP = 0.30
FLAT_TREND = 0.05  # reward gained per epoch below which the trend counts as flat
TREND_MIN_SPAN = 0.1  # epochs; over a shorter stretch the slope is noise
GIBBERISH_STOP = 0.50  # share of recent completions that look like random tokens

# Memorising: the training reward climbs while the held-out problems are solved no more often. The eval rows
# are train.py's metrics.jsonl rows: step, epoch, eval/pass@1, eval/reward, eval/stages/<stage>, ...
EVAL_PASS, EVAL_REWARD = "eval/pass@1", "eval/reward"
EVAL_WINDOW = 5  # evaluations judged together, like WINDOW for steps
MEMO_MIN_EVALS = 3  # two evaluations always lie on a line; three are the fewest that can contradict it
MEMO_MIN_SPAN = 0.2  # epochs from the first to the last evaluation judged (TREND_MIN_SPAN's reasoning)
# "Rising": the seed's trajectory gains 0.35 reward per epoch, so a learning run gains 0.10 in under a third
# of an epoch, while the seed's step-to-step noise (+-0.03) moves a slope fitted over 0.2 epochs far less.
MEMO_TRAIN_GAIN = 0.10
# "Flat": pass@1 on the 48 bundled eval problems moves in steps of about 0.02; fewer than three more solved
# over a stretch in which the training reward gained MEMO_TRAIN_GAIN is no progress on held-out problems.
MEMO_EVAL_GAIN = 0.05


@dataclass(frozen=True)
class Knobs:
    """Current values of the settings the advice changes; the defaults are the seed's run."""

    temperature: float = 0.9
    num_generations: int = 6
    learning_rate: float = 5e-6
    max_completion: int = 512
    min_non_empty_lines: int = 8

    @classmethod
    def from_args(cls, args: TrainingArguments) -> Knobs:
        """The knobs of a GRPOConfig; settings it does not carry keep the seed's values."""
        return cls(
            temperature=getattr(args, "temperature", cls.temperature),
            num_generations=getattr(args, "num_generations", cls.num_generations),
            learning_rate=getattr(args, "learning_rate", cls.learning_rate),
            max_completion=getattr(args, "max_completion_length", cls.max_completion) or cls.max_completion,
        )

    # Each step repeats the seed's move from these values (0.9 -> 1.1, 6 -> 8, 5e-6 -> 8e-6, 512 -> 600),
    # so a run that already took the advice gets the next step rather than the same numbers again.
    def hotter(self) -> str:
        return f"GRPO_TEMPERATURE={min(self.temperature + 0.2, 1.5):g}"

    def cooler(self) -> str:
        return f"GRPO_TEMPERATURE={max(self.temperature - 0.1, 0.5):g}"

    def more_generations(self) -> str:
        return f"GRPO_NUM_GENERATIONS={self.num_generations + 2}"

    def faster(self) -> str:
        return f"GRPO_LEARNING_RATE={_short(self.learning_rate * 1.6)}"

    def slower(self) -> str:
        return f"GRPO_LEARNING_RATE={_short(self.learning_rate / 2)}"

    def longer(self) -> str:
        return f"GRPO_MAX_COMPLETION={math.ceil(self.max_completion * 1.15 / 50) * 50}"

    def shorter_gate(self) -> str:
        return f"MIN_NON_EMPTY_LINES={max(self.min_non_empty_lines // 2, 1)}"


def _short(x: float) -> str:
    """8e-6 rather than 8e-06 or 8.000000000000001e-06: the way people write rates in .envrc."""
    return f"{x:.1e}".replace(".0e", "e").replace("e-0", "e-")


# The seed's contingency plans once epoch 1.0 has come without improvement.
CONTINGENCIES = (
    ("REWARD_CURRICULUM=1", "reward syntax and types first, tests later (option A)"),
    ("python test_base_model.py", "check the base model can solve these problems at all (option B)"),
)


class HealthLine(NamedTuple):
    """A line the monitor writes: `text` for learning.log; `level` (warn, or info for a recovery) and `title`
    (what the line is about, as it starts) for the dashboard's alert."""

    level: str
    title: str
    text: str


@dataclass(frozen=True)
class Check:
    """One threshold judged on the recent window. `ok` is None when the metric was not logged."""

    name: str
    title: str  # the issue a bad value points to, as the seed names it
    metric: str
    value: float | None
    band: str
    ok: bool | None
    meaning: str  # why a bad value matters
    advice: tuple[tuple[str, str], ...] = ()  # (env change, why)
    span: str = ""  # what the value was judged over, when not the last logged steps

    def headline(self) -> str:
        """The metric and its value, as its lines name it: `entropy=3`."""
        return f"{self.metric}={_num(self.value)}"

    def warning_line(self, epoch: float, steps: int) -> HealthLine:
        # Env changes read as a shell prefix; a command to run comes after them, never among them.
        settings = [change for change, _ in self.advice if not change.startswith("python ")]
        commands = [f"run {change}" for change, _ in self.advice if change.startswith("python ")]
        changes = ", then ".join(part for part in (" ".join(settings), *commands) if part)
        text = (
            f"WARNING [Epoch {epoch:.2f}] {self.headline()} over {self._over(steps)} "
            f"(expected {self.band}): {self.meaning}." + (f" Try {changes}" if changes else "")
        )
        return HealthLine("warn", self.headline(), text)

    def ok_line(self, epoch: float, steps: int) -> HealthLine:
        text = f"OK [Epoch {epoch:.2f}] {self.headline()} over {self._over(steps)}, back within {self.band}"
        return HealthLine("info", self.headline(), text)

    def _over(self, steps: int) -> str:
        return self.span or f"the last {steps} steps"


@dataclass(frozen=True)
class Criterion:
    """One of the seed's stop criteria; `holds` is None when the logs cannot tell."""

    name: str
    holds: bool | None
    evidence: str


def _num(value: float | None) -> str:
    return figure(value, ".3g")


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


def recent(history: Sequence[Row]) -> Sequence[Row]:
    return history[-WINDOW:]


def mean_of(rows: Sequence[Row], key: str) -> float | None:
    values = [float(r[key]) for r in rows if key in r and math.isfinite(float(r[key]))]
    return sum(values) / len(values) if values else None


def last_epoch(history: Sequence[Row]) -> float:
    return float(history[-1].get("epoch", 0.0)) if history else 0.0


def reward_floor(epoch: float) -> float:
    """The least mean reward a run on the seed's trajectory has at `epoch`."""
    for (e0, r0), (e1, r1) in itertools.pairwise(REWARD_MILESTONES):
        if epoch <= e1:
            return r0 + (r1 - r0) * (epoch - e0) / (e1 - e0)
    return REWARD_MILESTONES[-1][1]


def slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of y over x; None when x does not vary."""
    if not points:
        return None
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    var = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / var if var else None


def reward_trend(history: Sequence[Row]) -> float | None:
    """Least-squares slope of the mean reward per epoch over the whole run."""
    points = [(float(r["epoch"]), float(r["reward"])) for r in history if "epoch" in r and "reward" in r]
    if len(points) < MIN_STEPS or points[-1][0] - points[0][0] < TREND_MIN_SPAN:
        return None
    return slope(points)


def diversity_advice(history: Sequence[Row], knobs: Knobs) -> tuple[str, str]:
    """A hotter sampler, unless the samples are already random: then the base model is the suspect."""
    entropy = mean_of(recent(history), "entropy")
    if entropy is not None and entropy > ENTROPY_BAND[1]:
        return ("python test_base_model.py", "samples are already random; check what the base model can do")
    return (knobs.hotter(), "more diverse samples within each group")


def zero_std_key(rows: Sequence[Row]) -> str:
    """The metric that holds the seed's frac_zero_std, the share of sampled groups that tied: with dynamic
    sampling filtering, TRL's frac_reward_zero_std counts only the groups that trained (none tie), and
    `dynamic/frac_zero_std_sampled` counts every group sampled."""
    return SAMPLED_ZERO_STD if any(SAMPLED_ZERO_STD in r for r in rows) else "frac_reward_zero_std"


def stuck_groups(rows: Sequence[Row]) -> float | None:
    """Mean frac_zero_std (of the sampled groups) less the groups whose completions tie because every one
    passes (`groups/solved`, logged by the reward): a solved problem gives no signal either, but it is the
    goal, not a collapse."""
    key = zero_std_key(rows)
    values = [
        float(r[key]) - float(r.get("groups/solved", 0.0))
        for r in rows
        if key in r and math.isfinite(float(r[key]))
    ]
    return sum(values) / len(values) if values else None


def frac_zero_std_name(rows: Sequence[Row]) -> str:
    return (
        "frac_zero_std (solved groups left out)"
        if any("groups/solved" in r for r in rows)
        else "frac_zero_std"
    )


def check_frac_zero_std(history: Sequence[Row], knobs: Knobs) -> Check:
    value = stuck_groups(recent(history))
    return Check(
        "frac_zero_std",
        "Mode collapse",
        frac_zero_std_name(recent(history)),
        value,
        f"< {FRAC_ZERO_STD_MAX:.2f}",
        None if value is None else value < FRAC_ZERO_STD_MAX,
        "groups whose completions all score the same give GRPO no learning signal",
        (
            diversity_advice(history, knobs),
            (knobs.more_generations(), "more samples per prompt, so fewer groups tie"),
        ),
    )


def check_entropy_low(history: Sequence[Row], knobs: Knobs) -> Check:
    value = mean_of(recent(history), "entropy")
    low = ENTROPY_BAND[0]
    return Check(
        "entropy_low",
        "Unstable entropy",
        "entropy",
        value,
        f">= {low:.2f}",
        None if value is None else value >= low,
        "the model is too confident to explore",
        ((knobs.hotter(), "more exploration"),),
    )


def check_entropy_high(history: Sequence[Row], knobs: Knobs) -> Check:
    value = mean_of(recent(history), "entropy")
    high = ENTROPY_BAND[1]
    return Check(
        "entropy_high",
        "Unstable entropy",
        "entropy",
        value,
        f"<= {high:.2f}",
        None if value is None else value <= high,
        "the model is guessing rather than learning",
        ((knobs.cooler(), "less random sampling"),),
    )


def check_entropy_swing(history: Sequence[Row], knobs: Knobs) -> Check:
    values = [float(r["entropy"]) for r in recent(history) if "entropy" in r]
    value = max(values) - min(values) if len(values) >= 2 else None
    return Check(
        "entropy_swing",
        "Unstable entropy",
        "entropy swing (max - min)",
        value,
        f"< {ENTROPY_SWING_MAX:.2f}",
        None if value is None else value < ENTROPY_SWING_MAX,
        "wide swings mean an unstable balance between exploring and exploiting",
        ((knobs.more_generations(), "a steadier estimate per prompt"),),
    )


def check_reward_cv(history: Sequence[Row], knobs: Knobs) -> Check:
    window = recent(history)
    mean, std = mean_of(window, "reward"), mean_of(window, "reward_std")
    value = std / mean if mean and std is not None and mean > 0 else None
    return Check(
        "reward_cv",
        "High reward variance",
        "reward CV (std/mean)",
        value,
        f"< {REWARD_CV_MAX:.2f}",
        None if value is None else value < REWARD_CV_MAX,
        "output quality is inconsistent, so the learning signal is unstable",
        ((knobs.more_generations(), "more samples per prompt give a better advantage estimate"),),
    )


def check_reward_level(history: Sequence[Row], knobs: Knobs) -> Check:
    epoch = last_epoch(history)
    value = mean_of(recent(history), "reward")
    floor = reward_floor(epoch)
    clipped = mean_of(recent(history), "completions/clipped_ratio")
    if epoch >= STOP_EPOCH:
        advice: tuple[tuple[str, str], ...] = CONTINGENCIES
    else:
        advice = ((knobs.faster(), "rewards should climb faster"),)
        if clipped is None or clipped >= CLIPPED_MAX:
            advice += ((knobs.longer(), "if solutions are cut off before (* END *)"),)
    return Check(
        "reward_level",
        "Low absolute reward",
        "reward",
        value,
        f"> {floor:.2f} at epoch {epoch:.2f}; > 0.20 by 0.5, > 0.35 by 1.0",
        None if value is None else value > floor,
        "the run is behind the seed's trajectory",
        advice,
    )


def check_grad_norm_low(history: Sequence[Row], knobs: Knobs) -> Check:
    value = mean_of(recent(history), "grad_norm")
    low = GRAD_NORM_BAND[0]
    return Check(
        "grad_norm_low",
        "No learning signal",
        "grad_norm",
        value,
        f">= {low:g}",
        None if value is None else value >= low,
        "the policy is hardly being updated, usually because every group's rewards tie",
        (diversity_advice(history, knobs),),
    )


def check_grad_norm(history: Sequence[Row], knobs: Knobs) -> Check:
    values = [float(r["grad_norm"]) for r in recent(history) if "grad_norm" in r]
    value = max(values) if values else None
    high = GRAD_NORM_BAND[1]
    return Check(
        "grad_norm",
        "Gradient spikes",
        "grad_norm (max)",
        value,
        f"<= {high:g}",
        None if value is None else value <= high,
        "large updates can undo what the policy learned",
        ((knobs.slower(), "smaller steps"),),
    )


def check_clipped(history: Sequence[Row], knobs: Knobs) -> Check:
    value = mean_of(recent(history), "completions/clipped_ratio")
    return Check(
        "clipped",
        "Completions cut at the length limit",
        "completions/clipped_ratio",
        value,
        f"< {CLIPPED_MAX:.2f}",
        None if value is None else value < CLIPPED_MAX,
        "completions run past the length limit without (* END *): unfinished code or rambling",
        ((knobs.longer(), "room to finish when the clipped completions are unfinished code"),),
    )


CHECKS: tuple[Callable[[Sequence[Row], Knobs], Check], ...] = (
    check_frac_zero_std,
    check_reward_level,
    check_reward_cv,
    check_entropy_low,
    check_entropy_high,
    check_entropy_swing,
    check_grad_norm,
    check_grad_norm_low,
    check_clipped,
)


def run_checks(history: Sequence[Row], knobs: Knobs | None = None) -> list[Check]:
    """Every check on the recent window; an empty list while the run has too few steps to judge."""
    if len(history) < MIN_STEPS:
        return []
    return [check(history, knobs or Knobs()) for check in CHECKS]


def check_gated(gated_share: float | None, knobs: Knobs) -> Check:
    """The 8-line gate zeroes short answers that fail their tests (a right one always scores): where many do,
    their groups tie at 0 with no partial credit to rank them. Judged from the reward logs, counting only
    gated completions that look like code (gating gibberish is the gate doing its job)."""
    return Check(
        "gated",
        "Short answers gated",
        "gated share (code-like completions)",
        gated_share,
        f"< {GATED_MAX:.2f}",
        None if gated_share is None else gated_share < GATED_MAX,
        "completions that look like OCaml but are shorter than MIN_NON_EMPTY_LINES and fail their tests "
        "earn nothing, so their groups tie",
        ((knobs.shorter_gate(), "give short attempts the partial credit that ranks them"),),
    )


def check_memorising(history: Sequence[Row], evals: Sequence[Row], knobs: Knobs) -> Check:
    """Over the stretch of the last EVAL_WINDOW evaluations, the training reward must not rise while eval
    pass@1 stays flat. Early in a run the reward climbs on syntax and types alone, before any test passes;
    when the eval reward climbs with it (at least half as fast) the policy is learning OCaml on unseen
    problems too, so that is not memorising."""
    window = [e for e in evals[-EVAL_WINDOW:] if "epoch" in e]
    first, last = (window[0]["epoch"], window[-1]["epoch"]) if window else (0.0, 0.0)
    span = last - first

    def gain(points: Sequence[tuple[float, float]]) -> float | None:
        per_epoch = slope(points)  # rounded below so that a flat line reads 0, not 1.5e-32
        # + 0.0 turns the -0.0 that rounding leaves of a flat line's -1.5e-32 into 0.0.
        return None if per_epoch is None else round(per_epoch * span, 4) + 0.0

    train_gain = gain([(r["epoch"], r["reward"]) for r in history if first <= r.get("epoch", -1) <= last])
    pass_gain = gain([(e["epoch"], e[EVAL_PASS]) for e in window])
    reward_gain = gain([(e["epoch"], e[EVAL_REWARD]) for e in window if EVAL_REWARD in e])
    judged = len(window) >= MEMO_MIN_EVALS and span >= MEMO_MIN_SPAN and None not in (train_gain, pass_gain)
    ok = None
    if judged:
        eval_keeps_up = reward_gain is not None and reward_gain >= train_gain / 2
        ok = not (train_gain > MEMO_TRAIN_GAIN and pass_gain < MEMO_EVAL_GAIN and not eval_keeps_up)
    return Check(
        "memorising",
        "Memorising the training problems",
        "eval pass@1 gain",
        pass_gain if judged else None,
        f">= {MEMO_EVAL_GAIN:.2f} when the training reward gains > {MEMO_TRAIN_GAIN:.2f} (here "
        f"{_num(train_gain)}) and the eval reward less than half as much (here {_num(reward_gain)})",
        ok,
        "the policy scores better on its training problems but solves held-out ones no more often: it is "
        "memorising them. More varied problems (TRAINING_DATASET) help; keep the checkpoint with the best "
        "eval pass@1 rather than the last",
        ((knobs.slower(), "smaller steps fit the training problems less closely"),),
        f"{len(window)} evaluations at epoch {first:.2f}-{last:.2f}",
    )


_OCAML_WORD = re.compile(r"\b(let|match|with|fun|function|if|then|else|in|type)\b")


def looks_like_gibberish(text: str) -> bool:
    """Random tokens: no OCaml keyword at all, or mostly characters OCaml source does not use."""
    stripped = text.strip()
    if not stripped:
        return True
    foreign = sum(1 for ch in stripped if not (ch.isascii() and (ch.isprintable() or ch.isspace())))
    return foreign / len(stripped) > 0.2 or not _OCAML_WORD.search(stripped)


def stop_criteria(
    history: Sequence[Row], test_pass_share: float | None = None, gibberish_share: float | None = None
) -> list[Criterion]:
    """The seed's red flags on the recent window. Shares from the reward logs are passed in when known;
    without them the `stages/passed` metric, when logged, tells whether any test passes."""
    window = recent(history)
    reward = mean_of(window, "reward")
    frac = stuck_groups(window)
    trend = reward_trend(history)
    if test_pass_share is None:
        test_pass_share = mean_of(history, "stages/passed")
    floor = REWARD_MILESTONES[-1][1]
    flat = None if trend is None or reward is None else trend < FLAT_TREND and reward < floor
    return [
        Criterion(
            f"mean reward < {REWARD_STOP}",
            None if reward is None else reward < REWARD_STOP,
            f"mean reward {_num(reward)} over the last {len(window)} steps",
        ),
        Criterion(
            f"frac_zero_std > {FRAC_ZERO_STD_STOP}",
            None if frac is None else frac > FRAC_ZERO_STD_STOP,
            f"{frac_zero_std_name(window)} {_num(frac)} over the last {len(window)} steps",
        ),
        Criterion(
            "completions are gibberish",
            None if gibberish_share is None else gibberish_share > GIBBERISH_STOP,
            "not judged: no reward logs"
            if gibberish_share is None
            else f"{gibberish_share:.0%} of recent completions look like random tokens",
        ),
        Criterion(
            "no test passes",
            None if test_pass_share is None else test_pass_share == 0,
            "not judged: no stage shares logged"
            if test_pass_share is None
            else f"{test_pass_share:.1%} of completions pass tests",
        ),
        Criterion(
            f"reward trend flat or falling while below {floor}",
            flat,
            "not judged: too short a stretch of the run"
            if trend is None
            else f"reward trend {figure(trend, '+.3f')} per epoch",
        ),
    ]


def should_stop(history: Sequence[Row], criteria: Sequence[Criterion]) -> bool:
    """The seed stops a run at epoch 1.0 when any of its red flags holds."""
    enough = len(history) >= MIN_STEPS
    return enough and last_epoch(history) >= STOP_EPOCH and any(c.holds for c in criteria)


def verdict(
    history: Sequence[Row], checks: Sequence[Check], criteria: Sequence[Criterion]
) -> tuple[str, str]:
    """(status, decision): red/stop, yellow/adjust, green/continue, or yellow/continue when too early."""
    if len(history) < MIN_STEPS:
        return "yellow", "continue"
    if should_stop(history, criteria):
        return "red", "stop"
    if any(c.ok is False for c in checks):
        return "yellow", "adjust"
    return "green", "continue"


class HealthMonitor(TrainerCallback):
    """Judges the recent window at every logging step and writes one line when a check turns bad or
    recovers; with `stop_on_red_flags` it saves and stops once the seed's stop criteria hold at epoch 1.0.
    `add_eval` judges memorising at every held-out evaluation.

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
    ) -> None:
        self.write_line = write_line
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
        self.knobs = Knobs.from_args(args)
        history, evals = metric_history(self.earlier)
        self.history = [r for r in history if r["step"] <= state.global_step]
        self.evals = [e for e in evals if e["step"] <= state.global_step]
        memorising = check_memorising(self.history, self.evals, self.knobs)
        lines = self._transitions([*run_checks(self.history, self.knobs), memorising])
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
        lines = self._transitions(run_checks(self.history, self.knobs))
        criteria = stop_criteria(self.history)
        if should_stop(self.history, criteria) and not self.stop_reported:
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
        writes a line when the memorising check turns bad or recovers."""
        self.evals = one_per_step([*self.evals, numeric(row)])
        self._write(self._transitions([check_memorising(self.history, self.evals, self.knobs)]))

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
                    lines.append(check.warning_line(epoch, steps))
            elif self.bad.get(check.name):
                self.good_streak[check.name] = self.good_streak.get(check.name, 0) + 1
                if self.good_streak[check.name] >= RECOVER_STEPS:
                    self.bad[check.name] = False
                    lines.append(check.ok_line(epoch, steps))
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
            self.write_line(
                f"WARNING [Epoch {state.epoch or 0.0:.2f}] step {state.global_step + 1}: the gradient is not "
                f"finite (nan or inf), so this update was skipped and the weights are unchanged "
                f"({self.skipped} skipped so far). If it repeats, "
                f"try GRPO_LEARNING_RATE={args.learning_rate / 2:.2g}"
            )
