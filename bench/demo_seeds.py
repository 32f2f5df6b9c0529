"""`make demo` with three seeds: does GRPO raise the reward every time? The README's curves come from here.

    .venv/bin/python bench/demo_seeds.py [--seeds 42,1,2]    # about two minutes a seed on 2 cores

Runs `train.py --demo --seed S` for each seed into grpo_runs/demo-seed-S/ (the demo's own settings, an empty
environment otherwise), then prints, per seed, the mean reward of the first and last 5 GRPO steps, the
lowest frac_zero_std, how many completions passed every test, and the wall time; and plots the three
reward curves into bench/demo_seeds.png.
"""

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[1]
PLOT = ROOT / "bench" / "demo_seeds.png"


def run_demo(seed: int) -> tuple[Path, float]:
    out = ROOT / "grpo_runs" / f"demo-seed-{seed}"
    shutil.rmtree(out, ignore_errors=True)  # the bench's own last run: train.py refuses to start over it
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "train.py", "--demo", "--seed", str(seed), "--output-dir", str(out)],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return out, time.monotonic() - started


def steps_of(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    return [r for r in rows if "loss" in r]


def passed(out: Path) -> int:
    lines = (out / "reward_logs" / "syntax_aware_breakdown.jsonl").read_text(encoding="utf-8").splitlines()
    return sum(json.loads(line)["stage"] == "passed" for line in lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="42,1,2", help="comma-separated GRPO_SEED values")
    seeds = [int(s) for s in parser.parse_args().seeds.split(",")]

    print(
        "| seed | first 5 steps | last 5 steps | rise | lowest frac_zero_std | passed completions | wall s |"
    )
    print("|---|---|---|---|---|---|---|")
    runs = {}
    for seed in seeds:
        runs[seed], seconds = run_demo(seed)
        steps = steps_of(runs[seed])
        rewards = [r["reward"] for r in steps]
        first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
        low = min(r["frac_reward_zero_std"] for r in steps)
        print(
            f"| {seed} | {first:.3f} | {last:.3f} | {last - first:+.3f} | {low:.2f} | "
            f"{passed(runs[seed])} of {len(steps) * 24} | {seconds:.0f} |"
        )
    plot(runs)
    print(f"\nplot: {PLOT.relative_to(ROOT)}")
    return 0


def plot(runs: dict[int, Path]) -> None:
    """Each seed's reward per step, faint, under its mean over the last 5 steps."""
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for seed, out in runs.items():
        steps = steps_of(out)
        x, rewards = [r["step"] for r in steps], [r["reward"] for r in steps]
        window = [rewards[max(0, i - 4) : i + 1] for i in range(len(rewards))]
        (line,) = ax.plot(x, [sum(w) / len(w) for w in window], label=f"seed {seed} (mean of 5 steps)")
        ax.plot(x, rewards, color=line.get_color(), alpha=0.25)
    ax.set(
        title="make demo: GRPO reward per step after the SFT warm start", xlabel="GRPO step", ylabel="reward"
    )
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(PLOT)


if __name__ == "__main__":
    sys.exit(main())
