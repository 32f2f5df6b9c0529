"""Dynamic sampling, measured: `make demo`'s run and a hard start, GRPO_DYNAMIC_SAMPLING off against filter.

    .venv/bin/python bench/dynamic_sampling.py                       # every run missing, then the report
    .venv/bin/python bench/dynamic_sampling.py --report              # the report from the runs on disk
    .venv/bin/python bench/dynamic_sampling.py --only hard --seeds 42 --modes filter

Experiments (three seeds each; the demo's own settings, but 20 GRPO steps instead of 40 but for demo-40;
an empty environment):
- demo: `train.py --demo`, whose SFT warm start leaves about half the groups mixed. Here a third arm,
  `fill`, tops a short step up with the dropped groups of highest reward instead of training it smaller
  (`filling_trainer`, a subclass of the trainer): the demo's late steps, where most groups are solved, are
  short;
- hard: the demo with its SFT stopped at 60 of 180 steps, so that most groups fail alike (tie at a low
  reward), the seed's situation;
- demo-40: `make demo`'s run itself, 40 GRPO steps, from the demo experiment's SFT models.
Every run also evaluates data/demo_heldout.jsonl (a dozen unseen problems of the demo's kinds, 4 samples
each) at steps 0, 10 and 20: does GRPO raise pass@1 on problems it never trained on?

For a seed, the `off` run does the SFT and the other arms start from a copy of its SFT model, so the arms
differ only in GRPO. Runs go to
grpo_runs/dynamic-sampling/<experiment>-<mode>-<seed>/; the report prints markdown tables (BENCHMARKS.md)
and plots bench/dynamic_sampling.png. Wall-clock is the sum of TRL's per-step time (sampling, scoring and
the update; the held-out evaluations excluded, the same for both arms), on whatever the CPU was shared with.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from statistics import mean
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

if TYPE_CHECKING:
    import torch

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "grpo_runs" / "dynamic-sampling"
PLOT = ROOT / "bench" / "dynamic_sampling.png"
EXPERIMENTS = {"demo": [], "hard": ["--sft-max-steps", "60"], "demo-40": ["--max-steps", "40"]}
SFT_FROM = {"demo-40": "demo"}  # the same SFT model as the demo experiment's, seed for seed
MODES = ("off", "filter", "fill")
ARMS = {"demo": MODES, "hard": ("off", "filter"), "demo-40": ("off", "filter")}
OFF_BUDGET = {"demo": 20 * 24, "hard": 20 * 24, "demo-40": 40 * 24}  # what an `off` run samples
AVERAGED = ("at_budget", "first5", "last5", "sampled_tied", "extra_rounds", "sampled", "trained", "train_s")
SEEDS = (42, 1, 2)
COMMON = [
    "--max-steps",
    "20",
    *("--eval-dataset", "data/demo_heldout.jsonl", "--eval-steps", "10", "--eval-samples", "4"),
    *("--report-to", "none"),
]


def run_dir(experiment: str, mode: str, seed: int) -> Path:
    return RUNS / f"{experiment}-{mode}-{seed}"


def run(experiment: str, mode: str, seed: int) -> None:
    """One demo run; the filter arm starts from the off arm's SFT model (run that first)."""
    out = run_dir(experiment, mode, seed)
    if (out / "adapter").is_dir():
        return
    for path in out.glob("*"):  # an unfinished run; its tiny model and SFT model are kept
        if path.name not in ("tiny-model", "sft"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    sft_from = SFT_FROM.get(experiment, experiment)
    if (sft_from, mode) != (experiment, "off") and not (out / "sft" / "model" / "config.json").is_file():
        shutil.rmtree(out, ignore_errors=True)
        source = run_dir(sft_from, "off", seed)
        if not (source / "sft" / "model" / "config.json").is_file():
            run(sft_from, "off", seed)
        shutil.copytree(source / "tiny-model", out / "tiny-model")
        shutil.copytree(source / "sft", out / "sft")
    argv = ["--demo", "--seed", str(seed), "--output-dir", str(out)]
    argv += ["--dynamic-sampling", "off" if mode == "off" else "filter"]
    started = time.monotonic()
    print(f"{experiment} {mode} seed {seed} ...", flush=True)
    subprocess.run(
        ["nice", sys.executable, __file__, "--train", mode, *argv, *COMMON, *EXPERIMENTS[experiment]],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
        check=True,
        stdout=subprocess.DEVNULL,
    )
    (out / "bench_wall_s.txt").write_text(f"{time.monotonic() - started:.1f}\n")


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]


def summary(out: Path, budget: int = 20 * 24) -> dict:
    """What the report compares, from one run's metrics.jsonl and reward logs."""
    all_rows = rows(out)
    steps = [r for r in all_rows if "loss" in r]
    evals = [r for r in all_rows if "eval/pass@1" in r]
    completions = (out / "reward_logs" / "completions.jsonl").read_text(encoding="utf-8").splitlines()
    seconds, clock = [], 0.0
    for r in steps:
        clock += r.get("step_time", 0.0)
        seconds.append(clock)
    rewards = [r["reward"] for r in steps]
    group = 6  # the demo's GRPO_NUM_GENERATIONS
    trained = [r.get("dynamic/groups_trained", 4.0) for r in steps]
    spent, total = [], 0.0  # completions sampled up to each step: the cost that does not hang on the CPU
    for r in steps:
        total += r.get("dynamic/groups_sampled", 4.0) * group
        spent.append(total)
    within = [reward for reward, b in zip(rewards, spent, strict=True) if b <= budget]
    return {
        "step": [r["step"] for r in steps],
        "seconds": seconds,
        "spent": spent,
        "reward": rewards,
        "first5": mean(rewards[:5]),
        "last5": mean(rewards[-5:]),
        "at_budget": mean(within[-5:]),
        "sampled": len(completions),
        "trained": sum(trained) * group,
        "sampled_tied": mean(
            r.get("dynamic/frac_zero_std_sampled", r["frac_reward_zero_std"]) for r in steps
        ),
        "extra_rounds": mean(r.get("dynamic/extra_rounds", 0.0) for r in steps),
        "eval_steps": [r["step"] for r in evals],
        "pass1": [r["eval/pass@1"] for r in evals],
        "train_s": clock,
    }


def table(experiment: str, seeds: list[int]) -> list[str]:
    lines = [
        f"#### {experiment}",
        "",
        "| mode | seed | reward, first 5 steps | last 5 steps | "
        f"last 5 within {OFF_BUDGET[experiment]} completions | sampled groups tied | extra rounds / step | "
        "completions sampled | completions trained | train s | held-out pass@1, first -> last evaluation |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode in MODES:
        budget = OFF_BUDGET[experiment]
        found = [
            (s, summary(run_dir(experiment, mode, s), budget)) for s in seeds if done(experiment, mode, s)
        ]
        for seed, m in found:
            lines.append(
                f"| {mode} | {seed} | {m['first5']:.3f} | {m['last5']:.3f} | {m['at_budget']:.3f} | "
                f"{m['sampled_tied']:.2f} | "
                f"{m['extra_rounds']:.2f} | {m['sampled']} | {m['trained']:.0f} | {m['train_s']:.0f} | "
                f"{m['pass1'][0]:.3f} -> {m['pass1'][-1]:.3f} |"
            )
        if len(found) > 1:
            avg = {key: mean(m[key] for _, m in found) for key in found[0][1] if key in AVERAGED}
            start, end = (mean(m["pass1"][i] for _, m in found) for i in (0, -1))
            lines.append(
                f"| **{mode}** | mean | {avg['first5']:.3f} | {avg['last5']:.3f} | {avg['at_budget']:.3f} | "
                f"{avg['sampled_tied']:.2f} | {avg['extra_rounds']:.2f} | {avg['sampled']:.0f} | "
                f"{avg['trained']:.0f} | {avg['train_s']:.0f} | {start:.3f} -> {end:.3f} |"
            )
    return [*lines, ""]


def done(experiment: str, mode: str, seed: int) -> bool:
    return (run_dir(experiment, mode, seed) / "adapter").is_dir()


def plot(seeds: list[int]) -> None:
    """Per experiment: reward by step, by completions sampled and by training second, and held-out pass@1
    by step; each seed faint, the mean over seeds (and over the last 5 steps) bold."""
    fig, axes = plt.subplots(len(EXPERIMENTS), 4, figsize=(17, 3.4 * len(EXPERIMENTS)), squeeze=False)
    colors = {"off": "tab:blue", "filter": "tab:orange", "fill": "tab:green"}
    for row, experiment in zip(axes, EXPERIMENTS, strict=True):
        for mode in MODES:
            found = [summary(run_dir(experiment, mode, s)) for s in seeds if done(experiment, mode, s)]
            if not found:
                continue
            n = min(len(m["reward"]) for m in found)
            per_step = [mean(m["reward"][i] for m in found) for i in range(n)]
            avg = [mean(per_step[max(0, i - 4) : i + 1]) for i in range(n)]  # over 5 steps: less noise
            for ax, x in zip(row[:3], ("step", "spent", "seconds"), strict=True):
                for m in found:
                    ax.plot(m[x], m["reward"], color=colors[mode], alpha=0.2)
                xs = [mean(m[x][i] for m in found) for i in range(n)]
                ax.plot(xs, avg, color=colors[mode], label=f"{mode} (mean of {len(found)})")
            for m in found:
                row[3].plot(m["eval_steps"], m["pass1"], color=colors[mode], alpha=0.2, marker=".")
            k = min(len(m["pass1"]) for m in found)
            pass1 = [mean(m["pass1"][i] for m in found) for i in range(k)]
            row[3].plot(found[0]["eval_steps"][:k], pass1, color=colors[mode], marker="o", label=mode)
        titles = ("reward by step", "by completions sampled", "by training second", "held-out pass@1")
        xlabels = ("GRPO step", "completions sampled", "s (sum of step times)", "GRPO step")
        for ax, title, xlabel in zip(row, titles, xlabels, strict=True):
            ax.set(title=f"{experiment}: {title}", xlabel=xlabel)
            ax.grid(alpha=0.3)
        row[3].set_ylim(-0.02, 1)
        if row[0].get_legend_handles_labels()[0]:
            row[0].legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(PLOT, dpi=80)


def filling_trainer(base: type) -> type:
    """`base` (DynamicSamplingTrainer or a subclass of it) as the fill arm trains: a step short of a round's
    groups is topped up with the dropped groups of highest mean reward, which carry no advantage but do
    count in the loss's normaliser."""

    class FillingTrainer(base):
        def _sample_informative_groups(self, inputs: list[dict]) -> dict:
            self.group_means: list[list[float]] = []  # per round of the step, this process's groups
            return super()._sample_informative_groups(inputs)

        def _rewards_of_round(self) -> torch.Tensor:
            rewards = super()._rewards_of_round()  # every process's, once per round
            means = rewards.view(-1, self.num_generations).nanmean(dim=1)
            local = len(means) // self.accelerator.num_processes
            first = self.accelerator.process_index * local
            self.group_means.append(means[first : first + local].tolist())
            return rewards

        def _choose_kept(self, rounds: list, trained: int) -> None:
            super()._choose_kept(rounds, trained)
            target = len(rounds[0].tied)  # a round's groups on this process
            dropped = [
                (means[g], r, g)
                for r, means in zip(rounds, self.group_means, strict=True)
                for g in range(len(r.kept))
                if not r.kept[g]
            ]
            for _, r, g in sorted(dropped, key=lambda d: d[0], reverse=True)[: target - trained]:
                r.kept[g] = True

    return FillingTrainer


def train(mode: str, argv: list[str]) -> int:
    """train.py's main in this process; the fill arm's with its trainer."""
    sys.path.insert(0, str(ROOT))
    import dynamic_sampling
    import train

    if mode == "fill":  # train.py takes the trainer class from dynamic_sampling when the run starts
        dynamic_sampling.DynamicSamplingTrainer = filling_trainer(dynamic_sampling.DynamicSamplingTrainer)
    return train.main(argv)


def main() -> int:
    if sys.argv[1:2] == ["--train"]:
        return train(sys.argv[2], sys.argv[3:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", action="store_true", help="no runs: the report from the runs on disk")
    parser.add_argument("--only", choices=list(EXPERIMENTS), help="one experiment")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated modes to run")
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="comma-separated GRPO_SEED values")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    experiments = [args.only] if args.only else list(EXPERIMENTS)
    if not args.report:  # a seed's arms of both experiments first, so that a cut-short bench still compares
        for seed in seeds:
            for experiment in experiments:
                for mode in args.modes.split(","):
                    if mode in ARMS[experiment]:
                        run(experiment, mode, seed)
    for experiment in EXPERIMENTS:
        print("\n".join(table(experiment, list(SEEDS))))
    plot(list(SEEDS))
    print(f"plot: {PLOT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
