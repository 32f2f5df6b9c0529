"""Run health's bands, in two profiles that the live monitor (monitor.py) and the report (analyze.py) share.

`relative` (the default, GRPO_MONITOR_BANDS=relative) judges a run against itself: entropy against its first
steps, the share of tied groups against its first steps, the gradient norm against its own median, the
reward's trend while completions hit the length limit, and, with held-out evaluations, held-out progress
against the training reward's. It stops a run at any epoch once every group has tied for several steps with
nothing learned. What is normal differs by model, adapter, temperature and reward; what signals trouble on
any run is change against the run's own start.

`seed` (GRPO_MONITOR_BANDS=seed) is the seed analysis's absolute bands, read off one full fine-tune of the
1.5B, with its stop criteria at epoch 1.0, kept so that its analysis can still be reproduced.

Every check is a function of the run's metric history (a list of dicts keyed by TRL's metric names:
`reward`, `reward_std`, `entropy`, `frac_reward_zero_std`, `grad_norm`, `completions/clipped_ratio`,
`epoch`, ...) and judges the mean of the last WINDOW logging steps, because one GRPO step sees only a handful
of prompts and its metrics are noisy.
"""

from __future__ import annotations

import itertools
import math
import operator
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from run_records import SAMPLED_ZERO_STD, figure

Row = Mapping[str, float]
Rows = list[dict[str, float]]  # one per logged step, in step order

WINDOW = 10  # logging steps judged together
MIN_STEPS = 5  # fewer logged steps than this and we say so instead of judging
CLIPPED_MAX = 0.10  # share of completions cut at the length limit (runaways and filibusters)
GATED_MAX = 0.25  # share of completions zeroed by the MIN_NON_EMPTY_LINES gate
FLAT_TREND = 0.05  # reward gained per epoch below which the trend counts as flat
TREND_MIN_SPAN = 0.1  # epochs; over a shorter stretch the slope is noise
GIBBERISH_STOP = 0.50  # share of recent completions that look like random tokens
# The learning bench (docs/real-model.md): on the real 0.5B's LoRA only 5e-5 moved the held-out problems, and
# its gradient norms were no larger than at 5e-6. No advice lowers a learning rate below it.
LORA_LR_FLOOR = 5e-5

# The seed's bands.
FRAC_ZERO_STD_MAX = 0.10
ENTROPY_BAND = (0.10, 0.20)
ENTROPY_SWING_MAX = 0.08  # max - min over the window; the seed's 0.078-0.165 swing is "highly variable"
REWARD_CV_MAX = 0.30  # reward std / reward mean
GRAD_NORM_BAND = (0.01, 0.5)
# Minimum mean reward, interpolated linearly between the seed's milestones (> 0.20 at 0.5, > 0.35 at 1.0).
REWARD_MILESTONES = ((0.0, 0.0), (0.5, 0.20), (1.0, 0.35))
TEST_PASS_SHARE_AT_ONE = 0.10  # "regular test passes (10-20% of samples)" at epoch 1.0
# The seed's stop criteria, decided at epoch 1.0.
STOP_EPOCH = 1.0
REWARD_STOP = 0.15
FRAC_ZERO_STD_STOP = 0.30

# The relative bands. The early level is the mean of the first BASELINE_STEPS logged steps: on the learning
# bench's nine real runs the entropy of the last 10 steps stayed at 0.78-1.04 of it, the share of tied
# groups rose by 0.15 at most, and no step's gradient norm was over 2.5 times the run's median.
BASELINE_STEPS = 5
ENTROPY_FALL = 0.5  # entropy below half its early level: the policy narrows onto a few answers
TIED_RISE = 0.30  # the share of tied groups up this much over its early level
GRAD_JUMP = 10.0  # a gradient norm an order of magnitude over the run's median
# Every group tied on this many logged steps in a row, the reward no higher than at the start: no gradient
# and nothing learned, which more steps cannot change (a group ties at any reward; one that passes is solved).
COLLAPSE_STEPS = 5
TIED = 0.999  # a step's tied share at or above this is every group
REWARD_PROGRESS = 0.05  # reward gained over the first steps that counts as learning

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
# The learning bench's arms that changed nothing measurable gained 0.008-0.021 of held-out mean reward; lr
# 5e-5, the one that learned, 0.058.
HELDOUT_REWARD_GAIN = 0.03


@dataclass(frozen=True)
class Knobs:
    """Current values of the settings the advice changes; the defaults are the seed's run."""

    temperature: float = 0.9
    num_generations: int = 6
    learning_rate: float = 5e-6
    max_completion: int = 512
    min_non_empty_lines: int = 8

    # Each step repeats the seed's move from these values (0.9 -> 1.1, 6 -> 8, 5e-6 -> 8e-6, 512 -> 600),
    # so a run that already took the advice gets the next step rather than the same numbers again.
    def hotter(self) -> str:
        return f"GRPO_TEMPERATURE={min(self.temperature + 0.2, 1.5):g}"

    def cooler(self) -> str:
        return f"GRPO_TEMPERATURE={max(self.temperature - 0.1, 0.5):g}"

    def more_generations(self) -> str:
        return f"GRPO_NUM_GENERATIONS={self.num_generations + 2}"

    def faster(self) -> str:
        return f"GRPO_LEARNING_RATE={short_rate(self.learning_rate * 1.6)}"

    def slower(self) -> str:
        """Half the rate, but never below LORA_LR_FLOOR; "" (no advice) when the rate is there already."""
        lower = max(self.learning_rate / 2, LORA_LR_FLOOR)
        return f"GRPO_LEARNING_RATE={short_rate(lower)}" if lower < self.learning_rate else ""

    def longer(self) -> str:
        return f"GRPO_MAX_COMPLETION={math.ceil(self.max_completion * 1.15 / 50) * 50}"

    def shorter_gate(self) -> str:
        return f"MIN_NON_EMPTY_LINES={max(self.min_non_empty_lines // 2, 1)}"


def short_rate(x: float) -> str:
    """8e-6 rather than 8e-06 or 8.000000000000001e-06: the way people write rates in .envrc."""
    return f"{x:.1e}".replace(".0e", "e").replace("e-0", "e-")


# The seed's contingency plans once epoch 1.0 has come without improvement.
CONTINGENCIES = (
    ("REWARD_CURRICULUM=1", "reward syntax and types first, tests later (option A)"),
    ("python test_base_model.py", "check the base model can solve these problems at all (option B)"),
)


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
    advice: tuple[tuple[str, str], ...] = ()  # (env change, why); a change given as "" is no advice
    span: str = ""  # what the value was judged over, when not the last logged steps
    limit: float | None = None  # the number the value is held against, for the report's plots

    def __post_init__(self) -> None:
        object.__setattr__(self, "advice", tuple(a for a in self.advice if a[0]))

    def headline(self) -> str:
        """The metric and its value, as its lines name it: `entropy=3`."""
        return f"{self.metric}={_num(self.value)}"


@dataclass(frozen=True)
class Criterion:
    """One stop criterion; `holds` is None when the logs cannot tell."""

    name: str
    holds: bool | None
    evidence: str


def _num(value: float | None) -> str:
    return figure(value, ".3g")


def recent(history: Sequence[Row]) -> Sequence[Row]:
    return history[-WINDOW:]


def early(history: Sequence[Row]) -> Sequence[Row]:
    return history[:BASELINE_STEPS]


def values_of(rows: Sequence[Row], key: str) -> list[float]:
    return [float(r[key]) for r in rows if key in r and math.isfinite(float(r[key]))]


def mean_of(rows: Sequence[Row], key: str) -> float | None:
    values = values_of(rows, key)
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


def tied_shares(rows: Sequence[Row]) -> list[float]:
    """Per step, frac_zero_std (of the sampled groups) less the groups whose completions tie because every
    one passes (`groups/solved`, logged by the reward): a solved problem gives no signal either, but it is
    the goal, not a collapse."""
    key = zero_std_key(rows)
    return [
        float(r[key]) - float(r.get("groups/solved", 0.0))
        for r in rows
        if key in r and math.isfinite(float(r[key]))
    ]


def stuck_groups(rows: Sequence[Row]) -> float | None:
    """The mean share of tied groups that are not solved (tied_shares)."""
    values = tied_shares(rows)
    return sum(values) / len(values) if values else None


def frac_zero_std_name(rows: Sequence[Row]) -> str:
    return (
        "frac_zero_std (solved groups left out)"
        if any("groups/solved" in r for r in rows)
        else "frac_zero_std"
    )


# A band's words begin with the sign that a healthy value holds to the band's limit; these are their tests.
HEALTHY = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


def band_check(
    name: str,
    title: str,
    metric: str,
    value: float | None,
    band: str,
    limit: float | None,
    meaning: str,
    advice: tuple[tuple[str, str], ...],
) -> Check:
    """A check of `value` against one edge of a band, unjudged while the value or the limit is unknown. The
    test is the sign `band` begins with, so the band shown and the test made cannot disagree."""
    ok = None if value is None or limit is None else HEALTHY[band.split(" ", 1)[0]](value, limit)
    return Check(name, title, metric, value, band, ok, meaning, advice, limit=limit)


# --- the seed's bands ----------------------------------------------------------------------------------


def check_frac_zero_std(history: Sequence[Row], knobs: Knobs) -> Check:
    return band_check(
        "frac_zero_std",
        "Mode collapse",
        frac_zero_std_name(recent(history)),
        stuck_groups(recent(history)),
        f"< {FRAC_ZERO_STD_MAX:.2f}",
        FRAC_ZERO_STD_MAX,
        "groups whose completions all score the same give GRPO no learning signal",
        (
            diversity_advice(history, knobs),
            (knobs.more_generations(), "more samples per prompt, so fewer groups tie"),
        ),
    )


def check_entropy_low(history: Sequence[Row], knobs: Knobs) -> Check:
    return band_check(
        "entropy_low",
        "Unstable entropy",
        "entropy",
        mean_of(recent(history), "entropy"),
        f">= {ENTROPY_BAND[0]:.2f}",
        ENTROPY_BAND[0],
        "the model is too confident to explore",
        ((knobs.hotter(), "more exploration"),),
    )


def check_entropy_high(history: Sequence[Row], knobs: Knobs) -> Check:
    return band_check(
        "entropy_high",
        "Unstable entropy",
        "entropy",
        mean_of(recent(history), "entropy"),
        f"<= {ENTROPY_BAND[1]:.2f}",
        ENTROPY_BAND[1],
        "the model is guessing rather than learning",
        ((knobs.cooler(), "less random sampling"),),
    )


def check_entropy_swing(history: Sequence[Row], knobs: Knobs) -> Check:
    values = values_of(recent(history), "entropy")
    return band_check(
        "entropy_swing",
        "Unstable entropy",
        "entropy swing (max - min)",
        max(values) - min(values) if len(values) >= 2 else None,
        f"< {ENTROPY_SWING_MAX:.2f}",
        ENTROPY_SWING_MAX,
        "wide swings mean an unstable balance between exploring and exploiting",
        ((knobs.more_generations(), "a steadier estimate per prompt"),),
    )


def check_reward_cv(history: Sequence[Row], knobs: Knobs) -> Check:
    window = recent(history)
    mean, std = mean_of(window, "reward"), mean_of(window, "reward_std")
    return band_check(
        "reward_cv",
        "High reward variance",
        "reward CV (std/mean)",
        std / mean if mean and std is not None and mean > 0 else None,
        f"< {REWARD_CV_MAX:.2f}",
        REWARD_CV_MAX,
        "output quality is inconsistent, so the learning signal is unstable",
        ((knobs.more_generations(), "more samples per prompt give a better advantage estimate"),),
    )


def check_reward_level(history: Sequence[Row], knobs: Knobs) -> Check:
    epoch = last_epoch(history)
    floor = reward_floor(epoch)
    clipped = mean_of(recent(history), "completions/clipped_ratio")
    if epoch >= STOP_EPOCH:
        advice: tuple[tuple[str, str], ...] = CONTINGENCIES
    else:
        advice = ((knobs.faster(), "rewards should climb faster"),)
        if clipped is None or clipped >= CLIPPED_MAX:
            advice += ((knobs.longer(), "if solutions are cut off before (* END *)"),)
    return band_check(
        "reward_level",
        "Low absolute reward",
        "reward",
        mean_of(recent(history), "reward"),
        f"> {floor:.2f} at epoch {epoch:.2f}; > 0.20 by 0.5, > 0.35 by 1.0",
        floor,
        "the run is behind the seed's trajectory",
        advice,
    )


def check_grad_norm_low(history: Sequence[Row], knobs: Knobs) -> Check:
    return band_check(
        "grad_norm_low",
        "No learning signal",
        "grad_norm",
        mean_of(recent(history), "grad_norm"),
        f">= {GRAD_NORM_BAND[0]:g}",
        GRAD_NORM_BAND[0],
        "the policy is hardly being updated, usually because every group's rewards tie",
        (diversity_advice(history, knobs),),
    )


def check_grad_norm(history: Sequence[Row], knobs: Knobs) -> Check:
    values = values_of(recent(history), "grad_norm")
    return band_check(
        "grad_norm",
        "Gradient spikes",
        "grad_norm (max)",
        max(values) if values else None,
        f"<= {GRAD_NORM_BAND[1]:g}",
        GRAD_NORM_BAND[1],
        "large updates can undo what the policy learned",
        ((knobs.slower(), "smaller steps"),),
    )


def check_clipped(history: Sequence[Row], knobs: Knobs) -> Check:
    return band_check(
        "clipped",
        "Completions cut at the length limit",
        "completions/clipped_ratio",
        mean_of(recent(history), "completions/clipped_ratio"),
        f"< {CLIPPED_MAX:.2f}",
        CLIPPED_MAX,
        "completions run past the length limit without (* END *): unfinished code or rambling",
        ((knobs.longer(), "room to finish when the clipped completions are unfinished code"),),
    )


def seed_criteria(
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
        gibberish_criterion(gibberish_share),
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


# --- the relative bands --------------------------------------------------------------------------------


def check_tied_rise(history: Sequence[Row], knobs: Knobs) -> Check:
    start = stuck_groups(early(history))
    return band_check(
        "tied_rise",
        "Tied groups rising",
        frac_zero_std_name(recent(history)),
        stuck_groups(recent(history)),
        f"<= {TIED_RISE:.2f} over its first {BASELINE_STEPS} steps' {_num(start)}",
        None if start is None else start + TIED_RISE,
        "more and more groups score all alike, and a tied group gives GRPO no learning signal",
        (
            (knobs.hotter(), "more diverse samples within each group"),
            (knobs.more_generations(), "more samples per prompt, so fewer groups tie"),
        ),
    )


def check_entropy_fall(history: Sequence[Row], knobs: Knobs) -> Check:
    start = mean_of(early(history), "entropy")
    return band_check(
        "entropy_fall",
        "Entropy collapsing",
        "entropy",
        mean_of(recent(history), "entropy"),
        f">= {ENTROPY_FALL:g} x its first {BASELINE_STEPS} steps' {_num(start)}",
        None if start is None else ENTROPY_FALL * start,
        "the policy is narrowing onto a few answers and stops exploring",
        ((knobs.hotter(), "more exploration"),),
    )


def check_grad_jump(history: Sequence[Row], knobs: Knobs) -> Check:
    values = values_of(history, "grad_norm")
    median = statistics.median(values) if values else None
    peaks = values_of(recent(history), "grad_norm")
    return band_check(
        "grad_jump",
        "Gradient spikes",
        "grad_norm (max)",
        max(peaks) if peaks else None,
        f"<= {GRAD_JUMP:g} x the run's median {_num(median)}",
        None if median is None else GRAD_JUMP * median,
        "an update an order of magnitude larger than the run's usual can undo what the policy learned",
        ((knobs.slower(), "smaller steps"),),
    )


def check_reward_stalled(history: Sequence[Row], knobs: Knobs) -> Check:
    trend = reward_trend(history)
    value = mean_of(recent(history), "completions/clipped_ratio")
    stalled = None if trend is None or value is None else trend < FLAT_TREND and value >= CLIPPED_MAX
    return Check(
        "reward_stalled",
        "Reward stalled at the length limit",
        "completions/clipped_ratio",
        value,
        f"< {CLIPPED_MAX:.2f} while the reward trend ({figure(trend, '+.3f')} per epoch) is under "
        f"+{FLAT_TREND:g}",
        None if stalled is None else not stalled,
        "the reward does not climb while completions run into the length limit: unfinished code or rambling",
        ((knobs.longer(), "room to finish when the clipped completions are unfinished code"),),
    )


def relative_criteria(
    history: Sequence[Row], test_pass_share: float | None = None, gibberish_share: float | None = None
) -> list[Criterion]:
    """Red flags that hold on any model: every group tied for COLLAPSE_STEPS steps without the reward having
    risen over the run's first steps (no gradient, nothing learned), or completions of random tokens."""
    window = history[-COLLAPSE_STEPS:]
    tied = tied_shares(window)
    start, now = mean_of(early(history), "reward"), mean_of(window, "reward")
    grads = values_of(window, "grad_norm")
    collapsed = None
    evidence = f"not judged: fewer than {COLLAPSE_STEPS} steps with frac_zero_std"
    if len(tied) == COLLAPSE_STEPS and start is not None and now is not None:
        collapsed = min(tied) >= TIED and now < start + REWARD_PROGRESS
        shares = _num(min(tied)) if min(tied) == max(tied) else f"{_num(min(tied))}-{_num(max(tied))}"
        evidence = (
            f"tied share {shares} on the last {COLLAPSE_STEPS} steps, grad_norm at most "
            f"{_num(max(grads) if grads else None)}, mean reward {_num(now)} against {_num(start)} over the "
            f"first {BASELINE_STEPS}"
        )
    return [
        Criterion(f"every group tied for {COLLAPSE_STEPS} steps, nothing learned", collapsed, evidence),
        gibberish_criterion(gibberish_share),
    ]


# --- both profiles -------------------------------------------------------------------------------------


def gibberish_criterion(gibberish_share: float | None) -> Criterion:
    return Criterion(
        "completions are gibberish",
        None if gibberish_share is None else gibberish_share > GIBBERISH_STOP,
        "not judged: no reward logs"
        if gibberish_share is None
        else f"{gibberish_share:.0%} of recent completions look like random tokens",
    )


def check_gated(gated_share: float | None, knobs: Knobs) -> Check:
    """The 8-line gate zeroes short answers that fail their tests (a right one always scores): where many do,
    their groups tie at 0 with no partial credit to rank them. Judged from the reward logs, counting only
    gated completions that look like code (gating gibberish is the gate doing its job)."""
    return band_check(
        "gated",
        "Short answers gated",
        "gated share (code-like completions)",
        gated_share,
        f"< {GATED_MAX:.2f}",
        GATED_MAX,
        "completions that look like OCaml but are shorter than MIN_NON_EMPTY_LINES and fail their tests "
        "earn nothing, so their groups tie",
        ((knobs.shorter_gate(), "give short attempts the partial credit that ranks them"),),
    )


class EvalGains(NamedTuple):
    """Least-squares gains over the stretch of the last EVAL_WINDOW evaluations; `judged` when there are
    enough of them over a long enough stretch."""

    span: str
    train: float | None
    pass_at_1: float | None
    reward: float | None
    judged: bool


def eval_gains(history: Sequence[Row], evals: Sequence[Row]) -> EvalGains:
    window = [e for e in evals[-EVAL_WINDOW:] if "epoch" in e]
    first, last = (window[0]["epoch"], window[-1]["epoch"]) if window else (0.0, 0.0)

    def gain(points: Sequence[tuple[float, float]]) -> float | None:
        per_epoch = slope(points)  # rounded below so that a flat line reads 0, not 1.5e-32
        # + 0.0 turns the -0.0 that rounding leaves of a flat line's -1.5e-32 into 0.0.
        return None if per_epoch is None else round(per_epoch * (last - first), 4) + 0.0

    train = gain([(r["epoch"], r["reward"]) for r in history if first <= r.get("epoch", -1) <= last])
    pass_at_1 = gain([(e["epoch"], e[EVAL_PASS]) for e in window])
    reward = gain([(e["epoch"], e[EVAL_REWARD]) for e in window if EVAL_REWARD in e])
    judged = (
        len(window) >= MEMO_MIN_EVALS and last - first >= MEMO_MIN_SPAN and None not in (train, pass_at_1)
    )
    return EvalGains(
        f"{len(window)} evaluations at epoch {first:.2f}-{last:.2f}", train, pass_at_1, reward, judged
    )


def check_memorising(history: Sequence[Row], evals: Sequence[Row], knobs: Knobs) -> Check:
    """Over the stretch of the last EVAL_WINDOW evaluations, the training reward must not rise while eval
    pass@1 stays flat. Early in a run the reward climbs on syntax and types alone, before any test passes;
    when the eval reward climbs with it (at least half as fast) the policy is learning OCaml on unseen
    problems too, so that is not memorising."""
    g = eval_gains(history, evals)
    ok = None
    if g.judged:
        eval_keeps_up = g.reward is not None and g.reward >= g.train / 2
        ok = not (g.train > MEMO_TRAIN_GAIN and g.pass_at_1 < MEMO_EVAL_GAIN and not eval_keeps_up)
    return Check(
        "memorising",
        "Memorising the training problems",
        "eval pass@1 gain",
        g.pass_at_1 if g.judged else None,
        f">= {MEMO_EVAL_GAIN:.2f} when the training reward gains > {MEMO_TRAIN_GAIN:.2f} (here "
        f"{_num(g.train)}) and the eval reward less than half as much (here {_num(g.reward)})",
        ok,
        "the policy scores better on its training problems but solves held-out ones no more often: it is "
        "memorising them. More varied problems (TRAINING_DATASET) help; keep the checkpoint with the best "
        "eval pass@1 rather than the last",
        ((knobs.slower(), "smaller steps fit the training problems less closely"),),
        g.span,
    )


def check_heldout_stalled(history: Sequence[Row], evals: Sequence[Row], knobs: Knobs) -> Check:
    """The held-out problems neither solved more often nor scored higher over the last evaluations, while
    the training reward did not rise either (where it did, memorising speaks): the run is not learning."""
    g = eval_gains(history, evals)
    stalled = None
    if g.judged and g.reward is not None:
        stalled = (
            g.train <= MEMO_TRAIN_GAIN and g.pass_at_1 < MEMO_EVAL_GAIN and g.reward < HELDOUT_REWARD_GAIN
        )
    return Check(
        "heldout_stalled",
        "No progress on held-out problems",
        "eval reward gain",
        g.reward if stalled is not None else None,
        f">= {HELDOUT_REWARD_GAIN:.2f}, or an eval pass@1 gain >= {MEMO_EVAL_GAIN:.2f} (here "
        f"{_num(g.pass_at_1)})",
        None if stalled is None else not stalled,
        "held-out problems are solved no more often and score no higher than before: whatever the training "
        "reward does, the policy is not learning OCaml that carries over. Check the reward (a constant or "
        "random one teaches nothing) and the problems",
        (),
        g.span,
    )


_OCAML_WORD = re.compile(r"\b(let|match|with|fun|function|if|then|else|in|type)\b")


def looks_like_gibberish(text: str) -> bool:
    """Random tokens: no OCaml keyword at all, or mostly characters OCaml source does not use."""
    stripped = text.strip()
    if not stripped:
        return True
    foreign = sum(1 for ch in stripped if not (ch.isascii() and (ch.isprintable() or ch.isspace())))
    return foreign / len(stripped) > 0.2 or not _OCAML_WORD.search(stripped)


CheckFn = Callable[[Sequence[Row], Knobs], Check]
EvalCheckFn = Callable[[Sequence[Row], Sequence[Row], Knobs], Check]  # (history, evaluations, knobs)
# (history, share of completions passing tests, share of gibberish): the last two known from reward logs.
CriteriaFn = Callable[[Sequence[Row], float | None, float | None], list[Criterion]]


@dataclass(frozen=True)
class Profile:
    """A set of bands: the checks judged at every step and at every held-out evaluation, the stop criteria,
    and the epoch they apply from. `ranges` gives analyze.py's metric table, per row: the expected band in
    words and the checks behind it."""

    name: str
    about: str
    checks: tuple[CheckFn, ...]
    eval_checks: tuple[EvalCheckFn, ...]
    criteria: CriteriaFn
    stop_epoch: float
    ranges: Mapping[str, tuple[str, tuple[str, ...]]]

    def run_checks(self, history: Sequence[Row], knobs: Knobs | None = None) -> list[Check]:
        """Every check on the recent window; an empty list while the run has too few steps to judge."""
        if len(history) < MIN_STEPS:
            return []
        return [check(history, knobs or Knobs()) for check in self.checks]

    def run_eval_checks(self, history: Sequence[Row], evals: Sequence[Row], knobs: Knobs) -> list[Check]:
        return [check(history, evals, knobs) for check in self.eval_checks]

    def should_stop(self, history: Sequence[Row], criteria: Sequence[Criterion]) -> bool:
        enough = len(history) >= MIN_STEPS
        return enough and last_epoch(history) >= self.stop_epoch and any(c.holds for c in criteria)

    def verdict(
        self, history: Sequence[Row], checks: Sequence[Check], criteria: Sequence[Criterion]
    ) -> tuple[str, str]:
        """(status, decision): red/stop, yellow/adjust, green/continue, or yellow/continue when too early."""
        if len(history) < MIN_STEPS:
            return "yellow", "continue"
        if self.should_stop(history, criteria):
            return "red", "stop"
        if any(c.ok is False for c in checks):
            return "yellow", "adjust"
        return "green", "continue"


RELATIVE = Profile(
    "relative",
    f"each metric against the run's own first {BASELINE_STEPS} steps and running median; stop criteria at "
    "any epoch",
    (check_tied_rise, check_entropy_fall, check_grad_jump, check_reward_stalled),
    (check_memorising, check_heldout_stalled),
    relative_criteria,
    0.0,
    {
        "Gradient norm": (f"max <= {GRAD_JUMP:g} x the run's median", ("grad_jump",)),
        "Entropy": (f">= {ENTROPY_FALL:g} x its first {BASELINE_STEPS} steps", ("entropy_fall",)),
        "Reward (mean)": ("a trend, not a level: judged with the clipped share", ()),
        "Reward (std)": ("not a band: GRPO learns from the spread within a group", ()),
        "frac_zero_std": (f"<= its first {BASELINE_STEPS} steps + {TIED_RISE:.2f}", ("tied_rise",)),
        "Clipped completions": (
            f"< {CLIPPED_MAX:.2f} while the reward trend is flat (< +{FLAT_TREND:g} per epoch)",
            ("reward_stalled",),
        ),
    },
)
SEED = Profile(
    "seed",
    "the seed analysis's absolute bands, read off one full fine-tune of the 1.5B; stop criteria from "
    "epoch 1.0",
    (
        check_frac_zero_std,
        check_reward_level,
        check_reward_cv,
        check_entropy_low,
        check_entropy_high,
        check_entropy_swing,
        check_grad_norm,
        check_grad_norm_low,
        check_clipped,
    ),
    (check_memorising,),
    seed_criteria,
    STOP_EPOCH,
    {
        "Gradient norm": ("0.01 - 0.5", ("grad_norm", "grad_norm_low")),
        "Entropy": ("0.10 - 0.20, swing < 0.08", ("entropy_low", "entropy_high", "entropy_swing")),
        "Reward (mean)": ("> 0.20 by epoch 0.5, > 0.35 by 1.0", ("reward_level",)),
        "Reward (std)": ("< 30% of mean", ("reward_cv",)),
        "frac_zero_std": ("< 0.10", ("frac_zero_std",)),
        "Clipped completions": ("< 0.10", ("clipped",)),
    },
)
PROFILES = {profile.name: profile for profile in (RELATIVE, SEED)}  # GRPO_MONITOR_BANDS's values
