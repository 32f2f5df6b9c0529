"""Write the run-health report for a GRPO run: `python analyze.py RUN` (a run folder or its learning.log).

The report follows the seed analysis: status and decision first (machine-readable), an executive summary,
metric ranges against the expected bands, issues with evidence, env changes to try, the next milestone's
checklist and the stop criteria. With held-out evaluations it adds their table and their checks (memorising);
with the reward logs, where completions fail, the most common compiler errors and examples. Each step counts
once: after --resume the later lines win, and the report says where the run was resumed. It prints the
Markdown, writes RUN/analysis.md and saves PNG plots beside it. The bands live in health_bands.py, shared
with the live monitor; GRPO_MONITOR_BANDS (or --monitor-bands) picks the profile that judges, the relative
one by default. `python analyze.py --dashboard RUN` serves trackio's live dashboard of the runs under RUN
instead (dashboard.py).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

import dashboard
import envflags
import health_bands as bands
import monitor
from health_bands import (
    EVAL_PASS,
    EVAL_REWARD,
    PROFILES,
    RELATIVE,
    Check,
    Criterion,
    Knobs,
    Profile,
    Row,
    Rows,
)
from rewards import STAGES
from run_records import NO_VALUE, SAMPLED_ZERO_STD, figure, read_jsonl
from settings import TrainConfig

RECENT_COMPLETIONS = 200  # the reward-log rows that stand for "now"
EXAMPLES_PER_STAGE = 2

# learning.log's short names -> TRL's metric names; a `mean±std` value fills two.
LOG_NAMES = {
    "loss": ("loss",),
    "grad": ("grad_norm",),
    "lr": ("learning_rate",),
    "reward": ("reward", "reward_std"),
    "syntax_rew": ("rewards/syntax_aware_reward/mean", "rewards/syntax_aware_reward/std"),
    "entropy": ("entropy",),
    "frac_zero_std": ("frac_reward_zero_std",),  # with dynamic sampling, of the sampled groups
    "kept": ("dynamic/groups_trained", "dynamic/groups_sampled"),  # `kept=K/N`, dynamic sampling's
}
# The `[Eval ...]` line's names -> metrics.jsonl's eval row keys.
EVAL_NAMES = {
    "step": ("step",),
    "problems": ("eval/problems",),
    "samples": ("eval/samples",),
    "pass@1": (EVAL_PASS,),
    "reward": (EVAL_REWARD, "eval/reward_std"),
    **{stage: (f"eval/stages/{stage}",) for stage in STAGES},
}
LOG_LINE = re.compile(r"^\[Epoch\s+(?P<epoch>[0-9.eE+-]+)\]\s+(?P<pairs>.*)$")
EVAL_LINE = re.compile(r"^\[Eval Epoch\s+(?P<epoch>[0-9.eE+-]+)\]\s+(?P<pairs>.*)$")
PAIR = re.compile(r"([\w@]+)=(\S+)")


def metrics_of(match: re.Match[str], names: dict[str, tuple[str, ...]]) -> dict[str, float] | None:
    """A matched log line's epoch and name=value pairs under their metric names; None when a value is not a
    number."""
    try:
        row = {"epoch": float(match["epoch"])}
        for name, raw in PAIR.findall(match["pairs"]):
            # Pasted logs may show "±" decoded as Latin-1, i.e. "Â±"; n/a (no value) holds a "/" of its own.
            parts = re.split("[±/]", raw.replace("Â±", "±").replace(NO_VALUE, "nan"))
            for key, part in zip(names.get(name, ()), parts, strict=False):
                value = float(part)
                if math.isfinite(value):  # a metric without a value (n/a; nan before) is left out
                    row[key] = value
    except ValueError:
        return None
    return row


def parse_log_line(line: str) -> dict[str, float] | None:
    """One learning.log metrics line as TRL-named floats, or None for any other line."""
    match = LOG_LINE.match(line.strip())
    row = metrics_of(match, LOG_NAMES) if match else None
    return row if row and "reward" in row else None


def parse_eval_line(line: str) -> dict[str, float] | None:
    """One learning.log `[Eval ...]` line as its metrics.jsonl row, or None for any other line."""
    match = EVAL_LINE.match(line.strip())
    row = metrics_of(match, EVAL_NAMES) if match else None
    return row if row and "step" in row and EVAL_PASS in row else None


@dataclass
class Resume:
    """A header after the run had logged steps: train.py went on from a checkpoint, or started over."""

    checkpoint: str | None  # None: started again without --resume
    when: str
    earlier: list[int]  # steps past the checkpoint that the log already held
    logged: list[int] = field(default_factory=list)  # steps logged after this header

    def sentence(self) -> str:
        again = [s for s in self.earlier if s in self.logged]
        # The resumed run's first line replaces everything logged past the checkpoint (monitor.one_per_step).
        left_out = [s for s in self.earlier if s not in self.logged] if self.logged else []
        start = f"Resumed from {self.checkpoint}" if self.checkpoint else "Started again without a checkpoint"
        text = f"{start} at {self.when}; "
        text += f"{_were(again)} logged twice, the later ones count" if again else "no step was logged twice"
        if left_out:
            text += f"; {_were(left_out)} not reached again, so what the earlier run logged there is left out"
        return text + "."


def _were(steps: Sequence[int]) -> str:
    return f"step {steps[0]} was" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]} were"


HEADER_START = re.compile(
    r"^# (?P<when>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\s.*\b"
    r"(?:started|resumed from (?P<checkpoint>checkpoint-(?P<at>\d+)));"
)
HEADER_SETTING = re.compile(r"^#\s+(\w+) = (\S+)")
LOGGING_STEPS = re.compile(r"^#\s+logging_steps = (\d+)\b")


def read_log(log: Path) -> tuple[Rows, Rows, list[Resume]]:
    """learning.log's step lines and eval lines, each step once, and the resumes in it. A step line carries no
    step number: TRL logs every logging_steps-th step, counting from 0 or from the checkpoint's step after
    the header of a resumed run."""
    if not log.is_file():
        return [], [], []
    rows: Rows = []
    evals: Rows = []
    resumes: list[Resume] = []
    logging_steps = None  # TRL takes it from the checkpoint on resume, so the first header's holds throughout
    step = 0
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        if header := HEADER_START.match(line):
            step = int(header["at"] or 0)
            if header["checkpoint"] or rows:
                past = [int(r["step"]) for r in monitor.one_per_step(rows) if r["step"] > step]
                resumes.append(Resume(header["checkpoint"], header["when"], past))
        elif (setting := LOGGING_STEPS.match(line)) and logging_steps is None:
            logging_steps = int(setting[1])
        elif (row := parse_log_line(line)) is not None:
            every = logging_steps or 1  # a pasted log without its header: TrainConfig's default
            step = (step // every + 1) * every
            rows.append({**row, "step": float(step)})
            if resumes:
                resumes[-1].logged.append(step)
        elif (row := parse_eval_line(line)) is not None:
            evals.append(row)
    return monitor.one_per_step(rows), monitor.one_per_step(evals), resumes


def read_knobs(log: Path) -> Knobs:
    """The settings the advice changes, from the configuration train.py writes at the top of learning.log
    (the last header wins after a resume); the seed's values for whatever is not there."""
    found: dict[str, str] = {}
    if log.is_file():
        for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
            if match := HEADER_SETTING.match(line):
                found[match[1]] = match[2]
    names = {
        "temperature": ("temperature", float),
        "num_generations": ("num_generations", int),
        "learning_rate": ("learning_rate", float),
        "max_completion_length": ("max_completion", int),
        "min_non_empty_lines": ("min_non_empty_lines", int),
    }
    values = {}
    for key, (field_name, kind) in names.items():
        try:
            values[field_name] = kind(found[key])
        except (KeyError, ValueError):
            continue
    return Knobs(**values)


@dataclass
class Run:
    folder: Path
    source: str
    history: Rows
    evals: Rows = field(default_factory=list)
    resumes: list[Resume] = field(default_factory=list)
    knobs: Knobs = field(default_factory=Knobs)
    breakdown: list[dict] = field(default_factory=list)
    completions: list[dict] = field(default_factory=list)


def load_run(path: Path) -> Run:
    """Steps and evaluations from metrics.jsonl when present (every TRL metric), else from learning.log;
    the resumes from learning.log's headers."""
    folder = path if path.is_dir() else path.parent
    metrics = path if path.is_file() else folder / "metrics.jsonl"
    log = path if path.is_file() and path.suffix != ".jsonl" else folder / "learning.log"
    rows = read_jsonl(metrics) if metrics.suffix == ".jsonl" else []
    history, evals = monitor.metric_history(rows)
    log_history, log_evals, resumes = read_log(log)
    source = metrics.name
    if not history:
        if not log.is_file():
            raise SystemExit(f"analyze.py: no metrics.jsonl or learning.log in {folder}")
        history, evals, source = log_history, log_evals, log.name
    logs = folder / "reward_logs"
    return Run(
        folder,
        source,
        history,
        evals,
        resumes,
        read_knobs(log),
        read_jsonl(logs / "syntax_aware_breakdown.jsonl"),
        read_jsonl(logs / "completions.jsonl"),
    )


def stage_counts(breakdown: Sequence[dict]) -> Counter[str]:
    return Counter(str(row.get("stage", "unknown")) for row in breakdown)


def share(rows: Sequence[dict], predicate) -> float | None:
    return sum(1 for r in rows if predicate(r)) / len(rows) if rows else None


def passes_tests(row: dict) -> bool:
    return row.get("stage") == "passed" or (row.get("tests_passed") or 0) > 0


def gated_code(row: dict) -> bool:
    return row.get("stage") == "gated" and not bands.looks_like_gibberish(str(row.get("preview", "")))


ERROR_PLACE = re.compile(r"^(?:File \"[^\"]*\", )?line \d+(?:, characters \d+-\d+)?:\s*(?:Error:\s*)?")


def error_kind(sample: str) -> str:
    """The compiler's message without place or hint, so one kind of error counts together."""
    text = " ".join(str(sample).split())
    text = ERROR_PLACE.sub("", text).removeprefix("Error: ")
    return text.split(" Hint:")[0]


def common_errors(breakdown: Sequence[dict], top: int = 5) -> list[tuple[str, int]]:
    errors = Counter(
        error_kind(r["error_sample"])
        for r in breakdown
        if r.get("error_sample") and r.get("stage") in {"syntax_error", "type_error", "compile_error"}
    )
    return errors.most_common(top)


@dataclass
class Analysis:
    status: str
    decision: str
    checks: list[Check]
    criteria: list[Criterion]
    markdown: str


def _range(history: Sequence[Row], key: str) -> str:
    values = [r[key] for r in history if key in r]
    return f"{_fmt(min(values))} - {_fmt(max(values))}" if values else "not logged"


def _assess(checks: Sequence[Check]) -> str:
    judged = [c for c in checks if c.ok is not None]
    if not judged:
        return "not judged"
    bad = [c for c in judged if not c.ok]
    if not bad:
        return "ok"
    return "WARNING: " + ", ".join(f"{c.metric} {_fmt(c.value)}" for c in bad)


def _lr_phase(history: Sequence[Row]) -> str:
    values = [r["learning_rate"] for r in history if "learning_rate" in r]
    if len(values) < 2:
        return "not judged"
    if values[-1] > values[0]:
        return "rising (warmup)"
    return "falling (decay)" if values[-1] < values[0] else "constant"


def ranges_table(history: Sequence[Row], checks: dict[str, Check], profile: Profile) -> list[str]:
    rows = [
        ("Loss", "loss"),
        ("Gradient norm", "grad_norm"),
        ("Learning rate", "learning_rate"),
        ("Entropy", "entropy"),
        ("Reward (mean)", "reward"),
        ("Reward (std)", "reward_std"),
        ("frac_zero_std", bands.zero_std_key(history)),
        ("Clipped completions", "completions/clipped_ratio"),
    ]
    fixed = {
        "Loss": ("oscillating around 0 (normal for policy gradient)", "normal"),
        "Learning rate": ("GRPO_LEARNING_RATE after warmup", _lr_phase(history)),
    }
    lines = ["| Metric | Range | Expected | Assessment (last steps) |", "|---|---|---|---|"]
    for label, key in rows:
        if label in fixed:
            expected, assessment = fixed[label]
        else:
            expected, names = profile.ranges[label]
            assessment = _assess([checks[n] for n in names if n in checks]) if names else "not judged"
        if any(key in r for r in history):
            lines.append(f"| {label} | {_range(history, key)} | {expected} | {assessment} |")
    return lines


def issues_section(bad: Sequence[Check]) -> list[str]:
    lines = ["## Issues identified", ""]
    if not bad:
        return [*lines, "None: every judged metric is within its band.", ""]
    titles = list(dict.fromkeys(c.title for c in bad))
    for i, title in enumerate(titles, 1):
        lines.append(f"### {i}. {title}")
        for c in (c for c in bad if c.title == title):
            lines.append(f"- `{c.metric}` = {_fmt(c.value)}, expected {c.band}: {c.meaning}.")
        lines.append("")
    return lines


def actions_section(bad: Sequence[Check], decision: str, profile: Profile) -> list[str]:
    lines = [f"## Recommended actions ({profile.name} bands)", ""]
    # Several issues may call for the same change: one line naming them all, with the first reason.
    advised: dict[str, tuple[list[str], str]] = {}
    sources = [(c.title, a) for c in bad for a in c.advice]
    if decision == "stop":
        sources += [("Stop criteria hold", a) for a in bands.CONTINGENCIES]
    for title, (change, why) in sources:
        titles, _ = advised.setdefault(change, ([], why))
        if title.lower() not in titles:
            titles.append(title.lower())
    if not advised:
        return [*lines, "None: keep the current settings.", ""]
    lines.append("```bash")
    for change, (titles, why) in advised.items():
        prefix = "" if change.startswith("python ") else "export "
        if (smaller := smaller_change(change, advised)) != change:  # two issues pull one setting both ways
            lines.append(f"# not {change} ({', '.join(titles)}): {smaller} first, the smaller step")
            continue
        lines.append(f"{prefix}{change}  # {', '.join(titles)}: {why}")
    lines += ["```", ""]
    return lines


def smaller_change(change: str, advised: Mapping[str, object]) -> str:
    """Of the advised changes of the same setting (a low reward asks for a higher learning rate where
    gradient spikes ask for a lower one), the one with the smaller value: stability before speed."""
    name, _, value = change.partition("=")
    rivals = [other for other in advised if other.partition("=")[0] == name and other != change]
    if not value or not rivals:
        return change
    try:
        return min([change, *rivals], key=lambda text: float(text.partition("=")[2]))
    except ValueError:
        return change


def milestone_section(
    history: Sequence[Row], checks: dict[str, Check], pass_share: float | None
) -> list[str]:
    epoch = bands.last_epoch(history)
    trend = bands.reward_trend(history)
    reward = bands.mean_of(bands.recent(history), "reward")
    frac = checks["frac_zero_std"].value if "frac_zero_std" in checks else None
    swing = checks["entropy_swing"].value if "entropy_swing" in checks else None
    now = f"{pass_share:.1%}" if pass_share is not None else "n/a (no reward logs)"
    if epoch < 0.5:
        items = [
            f"frac_zero_std < {bands.FRAC_ZERO_STD_MAX:.2f} (now {_fmt(frac)})",
            f"mean reward > 0.20 (now {_fmt(reward)})",
            f"entropy stable: swing < {bands.ENTROPY_SWING_MAX} (now {_fmt(swing)})",
            f"some test passes appearing (now {now})",
        ]
        return ["## What to check at epoch 0.5", "", *[f"- [ ] {item}" for item in items], ""]
    if epoch < bands.STOP_EPOCH:
        items = [
            f"mean reward > 0.35 (now {_fmt(reward)})",
            f"clear upward trend in reward (now {_fmt(trend)} per epoch)",
            f"regular test passes, {bands.TEST_PASS_SHARE_AT_ONE:.0%}-20% of samples (now {now})",
        ]
        return ["## What to check at epoch 1.0", "", *[f"- [ ] {item}" for item in items], ""]
    return ["## Milestones", "", "Past epoch 1.0: the stop criteria below decide.", ""]


def _fmt(value: float | None) -> str:
    return figure(value, ".3g")


def stop_section(history: Sequence[Row], criteria: Sequence[Criterion], profile: Profile) -> list[str]:
    epoch, start = bands.last_epoch(history), profile.stop_epoch
    when = "they apply now" if epoch >= start else f"they apply from epoch {start:.1f}; now {epoch:.2f}"
    lines = [f"## Stop criteria ({when})", "", "| Red flag | Holds | Evidence |", "|---|---|---|"]
    for c in criteria:
        holds = "unknown" if c.holds is None else ("YES" if c.holds else "no")
        lines.append(f"| {c.name} | {holds} | {c.evidence} |")
    return [*lines, ""]


def stages_section(run: Run, gated: Check) -> list[str]:
    rows = run.breakdown
    counts = stage_counts(rows)
    lines = [f"## Where completions fail ({len(rows)} scored completions)", ""]
    lines += ["| Stage | Completions | Share |", "|---|---|---|"]
    for stage in [*STAGES, *sorted(set(counts) - set(STAGES))]:
        if counts[stage]:
            lines.append(f"| {stage} | {counts[stage]} | {counts[stage] / len(rows):.1%} |")
    compiled = sum(counts[s] for s in ("timeout", "runtime_error", "tests_failed", "passed"))
    some = sum(1 for r in rows if r.get("stage") == "tests_failed" and (r.get("tests_passed") or 0) > 0)
    runaway = sum(1 for r in rows if r.get("runaway_penalty_applied"))
    lines += [
        "",
        f"Compiled: {compiled / len(rows):.1%}. Passed some tests: {some / len(rows):.1%}. "
        f"Passed all tests: {counts['passed'] / len(rows):.1%}. "
        f"Runaway penalty applied: {runaway / len(rows):.1%}.",
        "",
    ]
    if gated.ok is False:
        lines += [
            f"**{gated.value:.0%} of recent completions look like OCaml but were gated** (fewer lines than "
            f"MIN_NON_EMPTY_LINES) and failed their tests: the gate gives them no partial credit, so their "
            f"groups tie. "
            f"Try `{gated.advice[0][0]}`.",
            "",
        ]
    errors = common_errors(rows)
    if errors:
        lines += ["### Most common compiler errors", "", "| Count | Error |", "|---|---|"]
        lines += [f"| {n} | `{text.replace('|', '/')}` |" for text, n in errors]
        lines.append("")
    lines += ["### Examples per failure stage", ""]
    for stage in STAGES[:-1]:
        examples = [r for r in rows if r.get("stage") == stage][-EXAMPLES_PER_STAGE:]
        for r in examples:
            preview = "\n".join(str(r.get("preview", "")).splitlines()[:12])
            lines += [f"**{stage}** ({r.get('problem_id', '?')}): {r.get('reason', '')}", ""]
            lines += fenced(preview, "ocaml")
            if r.get("error_sample"):
                lines += ["", *fenced("\n".join(str(r["error_sample"]).splitlines()[:6]), "text")]
            lines.append("")
    return lines


def fenced(text: str, info: str) -> list[str]:
    """A markdown code block holding `text` as it is: its fence is longer than any run of backticks in it,
    so a completion's own ```ocaml fence shows as text instead of closing the block."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}{info}", text, fence]


def eval_section(evals: Sequence[Row], eval_checks: Sequence[Check]) -> list[str]:
    last = evals[-1]
    lines = [
        "## Held-out evaluation",
        "",
        f"{_fmt(last.get('eval/problems'))} problems, {_fmt(last.get('eval/samples'))} sample(s) each, "
        "scored with the training reward.",
        "",
        "| Step | Epoch | pass@1 | Reward | Passed |",
        "|---|---|---|---|---|",
    ]
    for e in evals:
        lines.append(
            f"| {e['step']:.0f} | {e.get('epoch', math.nan):.2f} | {e[EVAL_PASS]:.1%} | "
            f"{e.get(EVAL_REWARD, math.nan):.3f} | {_pct(e.get('eval/stages/passed'))} |"
        )
    best = max(evals, key=lambda e: e[EVAL_PASS])
    lines += ["", f"Best eval pass@1: {best[EVAL_PASS]:.1%} at step {best['step']:.0f}.", ""]
    for check in eval_checks:
        if check.ok is None:
            lines.append(f"- {check.title}: not judged, the check needs {check.band}.")
            continue
        verdict = (
            f"**{check.title}.**" if check.ok is False else f"Not {check.title[0].lower()}{check.title[1:]}:"
        )
        lines.append(
            f"- {verdict} `{check.metric}` = {_fmt(check.value)} over {check.span}, expected {check.band}."
        )
    return [*lines, ""]


def dynamic_sampling_section(history: Sequence[Row]) -> list[str]:
    """What GRPO_DYNAMIC_SAMPLING=filter cost: groups sampled per group trained, extra rounds, short steps."""
    steps = [r for r in history if "dynamic/groups_sampled" in r]
    if not steps:
        return []
    sampled = sum(r["dynamic/groups_sampled"] for r in steps)
    trained = sum(r.get("dynamic/groups_trained", 0.0) for r in steps)
    tied = bands.mean_of(steps, SAMPLED_ZERO_STD) or bands.mean_of(steps, "frac_reward_zero_std")
    lines = [
        "## Dynamic sampling",
        "",
        f"Tied groups filtered out over {len(steps)} steps: {sampled:.0f} groups sampled, {trained:.0f} "
        f"trained ({trained / sampled:.0%}); on average {_fmt(tied)} of a step's sampled groups tied "
        "(frac_zero_std).",
    ]
    if all("dynamic/extra_rounds" in r for r in steps):  # metrics.jsonl has them, learning.log does not
        rounds = [r["dynamic/extra_rounds"] + 1 for r in steps]
        short = sum(
            r.get("dynamic/groups_trained", 0.0) < r["dynamic/groups_sampled"] / n
            for r, n in zip(steps, rounds, strict=True)
        )
        empty = sum(r.get("dynamic/groups_trained", 0.0) == 0 for r in steps)
        per_group = f"{sampled / trained:.2f}" if trained else "every sampled group, for none"
        lines.append(
            f"The filter sampled {sum(rounds) / len(rounds):.2f} rounds a step (`off` samples one), "
            f"{per_group} groups per group trained; {short} steps trained fewer groups than a round holds, "
            f"{empty} of them none."
        )
    return [*lines, ""]


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def summary(
    history: Sequence[Row], status: str, bad: Sequence[Check], criteria: Sequence[Criterion], profile: Profile
) -> str:
    epoch = bands.last_epoch(history)
    if len(history) < bands.MIN_STEPS:
        return (
            f"Too few steps to judge: {len(history)} logged step(s), at least {bands.MIN_STEPS} needed. "
            "Let the run go on and analyze again."
        )
    if status == "red":
        red = "; ".join(f"{c.name} ({c.evidence})" for c in criteria if c.holds)
        return (
            f"**Stop.** At epoch {epoch:.2f} the stop criteria hold: {red}. More steps of this setup will "
            "not help: try the curriculum, check the base model, or use a stronger one."
        )
    if status == "yellow":
        titles = ", ".join(dict.fromkeys(c.title.lower() for c in bad))
        when = f"at epoch {0.5 if epoch < 0.5 else 1.0}" if profile is PROFILES["seed"] else "in 10 steps"
        return (
            f"**Struggling.** {titles[0].upper() + titles[1:]}. Apply the env changes below before "
            f"continuing, then reassess {when}."
        )
    reward = bands.mean_of(bands.recent(history), "reward")
    trend = bands.reward_trend(history)
    return (
        f"**Healthy.** Mean reward {_fmt(reward)} (trend {_fmt(trend)} per epoch), every judged metric "
        "within its band. Continue."
    )


def analyze(run: Run, profile: Profile = RELATIVE) -> Analysis:
    """The report, judged by `profile`'s bands (the live monitor's, given the same GRPO_MONITOR_BANDS)."""
    knobs = run.knobs
    history = run.history
    check_list = profile.run_checks(history, knobs)
    recent_rows = run.breakdown[-RECENT_COMPLETIONS:]
    gated = bands.check_gated(share(recent_rows, gated_code), knobs)
    eval_checks = profile.run_eval_checks(history, run.evals, knobs)
    if len(history) >= bands.MIN_STEPS:
        check_list += [gated, *eval_checks]
    pass_share = share(recent_rows, passes_tests)
    texts = [str(r.get("completion", "")) for r in run.completions[-RECENT_COMPLETIONS:]]
    gibberish = sum(map(bands.looks_like_gibberish, texts)) / len(texts) if texts else None
    criteria = profile.criteria(history, pass_share, gibberish)
    status, decision = profile.verdict(history, check_list, criteria)
    checks = {c.name: c for c in check_list}
    bad = [c for c in check_list if c.ok is False]

    epochs = [r["epoch"] for r in history if "epoch" in r]
    span = f"epoch {min(epochs):.2f}-{max(epochs):.2f}" if epochs else "no steps"
    lines = [
        f"Status: {status}",
        f"Decision: {decision}",
        "",
        f"# Training analysis - {span}",
        "",
        f"Run: `{run.folder}` ({len(history)} logged steps with rewards, from {run.source}; checks judge "
        f"the last {min(len(history), bands.WINDOW)})",
        "",
        f"Judged by the {profile.name} bands (GRPO_MONITOR_BANDS={profile.name}): {profile.about}.",
        "",
    ]
    if run.resumes:
        lines += [*(f"- {resume.sentence()}" for resume in run.resumes), ""]
    lines += ["## Executive summary", "", summary(history, status, bad, criteria, profile), ""]
    if len(history) >= bands.MIN_STEPS:
        lines += ["## Metric ranges", "", *ranges_table(history, checks, profile), ""]
        lines += issues_section(bad)
        lines += actions_section(bad, decision, profile)
        if profile is PROFILES["seed"]:  # the seed's milestones are its own trajectory's
            lines += milestone_section(history, checks, pass_share)
        lines += stop_section(history, criteria, profile)
    lines += dynamic_sampling_section(history)
    if run.evals:
        lines += eval_section(run.evals, eval_checks)
    if run.breakdown:
        lines += stages_section(run, gated)
    return Analysis(status, decision, check_list, criteria, "\n".join(lines))


def stage_series(run: Run) -> tuple[list[float], dict[str, list[float]], str]:
    """Stage shares over the run: from the `stages/<stage>` metrics when logged, else from the reward
    logs in order, spread over the logged epochs (every step scores the same number of completions)."""
    rows = [r for r in run.history if any(k.startswith("stages/") for k in r)]
    if rows:
        xs = [r.get("epoch", i) for i, r in enumerate(rows)]
        return xs, {s: [r.get(f"stages/{s}", 0.0) for r in rows] for s in STAGES}, "epoch"
    breakdown = run.breakdown
    if not breakdown:
        return [], {}, ""
    chunks = min(20, len(breakdown))
    size = len(breakdown) / chunks
    parts = [breakdown[int(i * size) : int((i + 1) * size)] for i in range(chunks)]
    epochs = [r["epoch"] for r in run.history if "epoch" in r]
    lo, hi = (min(epochs), max(epochs)) if epochs else (0.0, 1.0)
    xs = [lo + (hi - lo) * (i + 0.5) / chunks for i in range(chunks)]
    series = {s: [sum(r.get("stage") == s for r in part) / len(part) for part in parts] for s in STAGES}
    return xs, series, "epoch (reward logs spread evenly)"


def save_plots(run: Run, folder: Path, checks: Sequence[Check]) -> list[Path]:
    """PNG plots beside analysis.md, with the edges of the bands that `checks` judged; a metric nobody logged
    gets no plot."""
    paths = []
    history = run.history
    epochs = [r.get("epoch", 0.0) for r in history]
    x_key, xlabel = "epoch", "epoch"
    if len(set(epochs)) < len(epochs):
        # learning.log rounds the epoch to two decimals: plot by step so lines do not fold back.
        x_key, xlabel = "step", f"step (epoch {min(epochs):.2f}-{max(epochs):.2f})"
    at = [r.get(x_key, 0.0) for r in history]
    reward = [r.get("reward", math.nan) for r in history]

    def new(title: str, ylabel: str, xlabel: str = xlabel):
        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
        ax.grid(alpha=0.3)
        return fig, ax

    def save(fig, name: str) -> None:
        fig.tight_layout()
        fig.savefig(folder / name)
        plt.close(fig)
        paths.append(folder / name)

    if history:
        fig, ax = new("Reward (mean ± std)", "reward")
        std = [r.get("reward_std", 0.0) for r in history]
        ax.plot(at, reward, label="mean")
        ax.fill_between(
            at,
            [m - s for m, s in zip(reward, std, strict=True)],
            [m + s for m, s in zip(reward, std, strict=True)],
            alpha=0.25,
            label="± std",
        )
        if any(c.name == "reward_level" for c in checks):
            floor = [bands.reward_floor(e) for e in epochs]
            ax.plot(at, floor, "--", color="gray", label="seed's minimum")
        ax.legend()
        save(fig, "analysis_reward.png")
    if run.evals:
        # Over the same x as the training reward: the two rising together is learning, apart memorising.
        fig, ax = new("Held-out evaluation against the training reward", "reward, pass@1")
        ax.plot(at, reward, color="gray", alpha=0.6, label="training reward")
        eval_at = [e.get(x_key, 0.0) for e in run.evals]
        ax.plot(eval_at, [e.get(EVAL_REWARD, math.nan) for e in run.evals], "o-", label="eval reward")
        ax.plot(eval_at, [e[EVAL_PASS] for e in run.evals], "s-", label="eval pass@1")
        ax.legend()
        save(fig, "analysis_eval.png")
    for key, name, judged_by in (
        (bands.zero_std_key(history), "frac_zero_std", {"frac_zero_std", "tied_rise"}),
        ("entropy", "entropy", {"entropy_low", "entropy_high", "entropy_fall"}),
    ):
        if any(key in r for r in history):
            fig, ax = new(name, name)
            ax.plot(at, [r.get(key, math.nan) for r in history])
            for check in (c for c in checks if c.name in judged_by and c.limit is not None):
                ax.axhline(check.limit, color="green", ls="--", label=f"band edge ({check.band})")
            ax.legend()
            save(fig, f"analysis_{name}.png")
    xs, series, xlabel = stage_series(run)
    if xs:
        fig, ax = new("Share of completions reaching each stage", "share", xlabel)
        ax.stackplot(xs, *series.values(), labels=list(series))
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        save(fig, "analysis_stages.png")
    return paths


def write_report(run: Run, profile: Profile = RELATIVE) -> tuple[Analysis, list[Path]]:
    """The analysis with its plots, written as analysis.md and PNG files into the run's folder."""
    result = analyze(run, profile)
    plots = save_plots(run, run.folder, result.checks)
    if plots:
        result.markdown += "\n## Plots\n\n" + "\n".join(f"![{p.stem}]({p.name})" for p in plots) + "\n"
    result.markdown += f"\n## Dashboard\n\n{dashboard.report_line(run.folder)}\n"
    (run.folder / "analysis.md").write_text(result.markdown, encoding="utf-8")
    return result, plots


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "run",
        type=Path,
        nargs="?",
        help="a run folder (with learning.log or metrics.jsonl) or a learning.log",
    )
    parser.add_argument(
        "--dashboard",
        type=Path,
        metavar="RUN",
        help="serve trackio's dashboard of the runs under RUN (e.g. grpo_runs) on 127.0.0.1; Ctrl-C stops it",
    )
    parser.add_argument("--port", type=int, help="--dashboard's port (default: the first free one from 7860)")
    envflags.add_argument(parser, TrainConfig, "monitor_bands")
    args = parser.parse_args(argv)
    if args.dashboard:
        return dashboard.serve(args.dashboard, args.port)
    if args.run is None:
        parser.error("give a run folder, or --dashboard RUN")
    if not args.run.exists():
        parser.error(f"{args.run} does not exist")
    try:  # as train.py resolves it: flag > env > default
        bands_env = {k: v for k, v in os.environ.items() if k == "GRPO_MONITOR_BANDS"}
        profile = PROFILES[envflags.resolve(TrainConfig, args, bands_env)[0].monitor_bands]
    except envflags.ConfigError as exc:
        parser.error(str(exc))
    result, _ = write_report(load_run(args.run), profile)
    print(result.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
