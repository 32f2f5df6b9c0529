"""Held-out evaluation time: one problem per generate call (the old test_base_model.py) against batches of
several problems' samples (evaluate.py), on the tests' tiny model (2 layers, 64 wide) on the CPU.

40 bundled problems x 4 samples, completions up to the demo's GRPO_MAX_COMPLETION (demo.DEMO_SETTINGS),
the rest of the settings at their defaults. Each round times every batch size once, in a rotating order;
the table shows the medians. Sampling is `evaluate.sample_completions`, scoring `evaluate.score_samples`
(the real reward on a warm sandbox pool).

    .venv/bin/python bench/eval_batching.py [--rounds 5] [--threads 1]
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import demo  # noqa: E402
import envflags  # noqa: E402
import evaluate  # noqa: E402
import models  # noqa: E402
import settings  # noqa: E402
from problems import BUNDLED_PROBLEMS, load_problems  # noqa: E402

PROBLEMS, SAMPLES = 40, 4
BATCH_SIZES = [SAMPLES, 8, 16, evaluate.DEFAULT_BATCH_SIZE, 64]  # SAMPLES: one problem per call


def timed_evaluation(model, tokenizer, problems: list[dict], cfg, batch_size: int) -> tuple[float, float]:
    """(sampling s, scoring s) of one evaluation."""
    start = time.perf_counter()
    samples = evaluate.sample_completions(
        model, tokenizer, problems, cfg, k=SAMPLES, batch_size=batch_size, seed=0
    )
    sampled = time.perf_counter()
    evaluate.score_samples(samples, problems, cfg)
    return sampled - start, time.perf_counter() - sampled


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds over every batch size (default 5)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1, as the demo: robust on shared cores)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    # An empty environment but for the demo's completion length: the shell's .envrc must not change it.
    max_completion = demo.DEMO_SETTINGS["GRPO_MAX_COMPLETION"]
    cfg = envflags.from_env(settings.TrainConfig, {"GRPO_MAX_COMPLETION": max_completion})
    problems = evaluate.pick_problems(load_problems(str(BUNDLED_PROBLEMS)), PROBLEMS, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        model, tokenizer = models.load_base(str(demo.build_tiny_model(Path(tmp) / "model")))
    timed_evaluation(model, tokenizer, problems[:2], cfg, SAMPLES)  # warm-up: torch, the sandbox workers

    times: dict[int, list[tuple[float, float]]] = {size: [] for size in BATCH_SIZES}
    for round_index in range(args.rounds):
        order = BATCH_SIZES[round_index % len(BATCH_SIZES) :] + BATCH_SIZES[: round_index % len(BATCH_SIZES)]
        for size in order:
            times[size].append(timed_evaluation(model, tokenizer, problems, cfg, size))
            print(f"round {round_index + 1}, batch {size}: {sum(times[size][-1]):.2f} s", file=sys.stderr)

    medians = {
        size: (statistics.median(s for s, _ in runs), statistics.median(r for _, r in runs))
        for size, runs in times.items()
    }
    baseline = sum(medians[SAMPLES])
    print(
        f"\n{PROBLEMS} problems x {SAMPLES} samples, the tests' tiny model on the CPU (torch threads: "
        f"{torch.get_num_threads()}), completions up to GRPO_MAX_COMPLETION={max_completion} tokens "
        f"(demo.DEMO_SETTINGS); medians of {args.rounds} rounds\n"
    )
    print("| completions per generate call | sampling s | scoring s | total s | speed-up |")
    print("|---|---|---|---|---|")
    for size, (sampling, scoring) in medians.items():
        name = f"{size} (one problem per call, as before)" if size == SAMPLES else str(size)
        if size == evaluate.DEFAULT_BATCH_SIZE:
            name += " (evaluate.py's default)"
        total = sampling + scoring
        print(f"| {name} | {sampling:.2f} | {scoring:.2f} | {total:.2f} | {baseline / total:.1f}x |")
    default = sum(medians[evaluate.DEFAULT_BATCH_SIZE])
    verdict = "met" if default < 60 else "missed"
    print(f"\nTarget, {PROBLEMS} x {SAMPLES} in under a minute: {verdict} ({default:.1f} s, default batch)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
