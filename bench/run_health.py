"""What both run-health profiles say about real runs, against what their held-out evaluation showed.

    .venv/bin/python bench/run_health.py           # print the table
    .venv/bin/python bench/run_health.py --write   # and put it into docs/run-health.md

Every run under tests/fixtures/runs/ (their README says where each came from) is judged by analyze.py, once
per profile of health_bands.py, at every logged step as the live monitor would: the table gives the verdict
at the run's end and the first step at which it was not green (and the step it said stop). The held-out
column comes from the learning bench's results.jsonl for its nine arms, from the run's own `[Eval ...]`
lines otherwise. tests/test_run_health.py keeps the table in docs/run-health.md equal to this.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import analyze  # noqa: E402
from health_bands import EVAL_PASS, EVAL_REWARD, PROFILES, RELATIVE, Profile  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "runs"
BENCH = ROOT / "bench" / "results" / "real_model" / "results.jsonl"
DOC = ROOT / "docs" / "run-health.md"
TABLE = re.compile(r"(<!-- health-table:start -->\n)(.*?)(\n<!-- health-table:end -->)", re.S)
# What the runs that are not the learning bench's arms are.
ABOUT = {
    "seed-analysis": "the seed analysis's six log lines (the 1.5B, full fine-tune, epoch 0.28-0.29)",
    "collapse-tiny": "a real short run in which every group ties (how: tests/fixtures/runs/README.md)",
    "collapse-real": "the same collapse on the real 0.5B (how: tests/fixtures/runs/README.md)",
    **{
        f"demo-seed-{seed}": f"`make demo` with GRPO_SEED={seed} (the tiny model, 40 steps)"
        for seed in (42, 1, 2)
    },
}
# The learning issue's runs without a GRPO log to judge, and why: no verdict is made up for them.
NOT_JUDGED = {
    "sft-only": "SFT alone: no GRPO step for the monitor to judge",
}


@dataclasses.dataclass(frozen=True)
class Verdict:
    status: str
    decision: str
    why: tuple[str, ...]  # the checks that failed at the end, and "stop criteria" when they held
    fired: int | None  # the first step judged other than green/continue
    first: tuple[str, ...]  # what failed there
    stopped: int | None  # the first step judged red/stop

    def cell(self) -> str:
        text = f"{self.status} / {self.decision}" + (f" ({', '.join(self.why)})" if self.why else "")
        if self.fired is None:
            return text + ", never fired"
        text += f"; first at step {self.fired} ({', '.join(self.first)})"
        return text + (f", stop at step {self.stopped}" if self.stopped is not None else "")


def judge(run: analyze.Run, profile: Profile) -> Verdict:
    """analyze.py's verdict at every logged step (each step's evaluations included), as the run went."""
    fired = stopped = None
    first: tuple[str, ...] = ()
    for n, row in enumerate(run.history, 1):
        step = row["step"]
        sofar = dataclasses.replace(
            run, history=run.history[:n], evals=[e for e in run.evals if e["step"] <= step]
        )
        report = analyze.analyze(sofar, profile)
        why = tuple(c.name for c in report.checks if c.ok is False)
        why += ("stop criteria",) if report.decision == "stop" else ()
        if report.decision != "continue" and fired is None:
            fired, first = int(step), why
        if report.decision == "stop" and stopped is None:
            stopped = int(step)
    return Verdict(report.status, report.decision, why, fired, first, stopped)


def fixture_runs() -> list[Path]:
    """The fixtures in the table's order: the learning bench's arms, then the others."""
    return sorted(
        (p for p in FIXTURES.iterdir() if (p / "learning.log").is_file()),
        key=lambda p: (not p.name.startswith("real-"), p.name),
    )


def bench_rows() -> dict[str, dict]:
    return {row["arm"]: row for row in map(json.loads, BENCH.read_text(encoding="utf-8").splitlines())}


def held_out(folder: Path, run: analyze.Run, bench: dict[str, dict]) -> str:
    arm = folder.name.removeprefix("real-")
    if arm in bench:
        h = bench[arm]["heldout"]
        return (
            f"pass@1 {h['pass@1_before']:.1%} -> {h['pass@1_after']:.1%}, mean reward "
            f"{h['mean_reward_before']:.3f} -> {h['mean_reward_after']:.3f}, {len(h['improved'])} problems "
            f"improved / {len(h['regressed'])} regressed"
        )
    if run.evals:
        first, last = run.evals[0], run.evals[-1]
        return (
            f"pass@1 {first[EVAL_PASS]:.1%} -> {last[EVAL_PASS]:.1%}, eval reward "
            f"{first[EVAL_REWARD]:.3f} -> {last[EVAL_REWARD]:.3f} (steps {first['step']:.0f}-"
            f"{last['step']:.0f})"
        )
    return "not evaluated"


def table() -> str:
    bench = bench_rows()
    lines = [
        "| run | what it is | relative (default) | seed | held-out evaluation |",
        "|---|---|---|---|---|",
    ]
    for folder in fixture_runs():
        run = analyze.load_run(folder)
        arm = folder.name.removeprefix("real-")
        about = (
            f"the learning bench, real 0.5B: {bench[arm]['lever']}" if arm in bench else ABOUT[folder.name]
        )
        cells = [judge(run, profile).cell() for profile in (RELATIVE, PROFILES["seed"])]
        lines.append(f"| {folder.name} | {about} | {' | '.join(cells)} | {held_out(folder, run, bench)} |")
    for name, why in NOT_JUDGED.items():
        lines.append(f"| {name} | the learning issue's {name} run | {why} | | |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="put the table into docs/run-health.md")
    text = table()
    print(text)
    if parser.parse_args().write:
        doc = DOC.read_text(encoding="utf-8")
        if not TABLE.search(doc):
            raise SystemExit("docs/run-health.md lacks the health-table markers")
        DOC.write_text(TABLE.sub(lambda m: m[1] + text + m[3], doc), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
