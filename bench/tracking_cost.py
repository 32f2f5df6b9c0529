"""What the trackio dashboard costs a training step: the demo's GRPO steps with tracking on and off, in one
process, each step measured both ways.

    .venv/bin/python bench/tracking_cost.py [--steps 40]    # about 5 minutes on 2 cores

Builds the demo's SFT model once into grpo_runs/bench-tracking/base/ (kept for the next time), then trains
`--steps` GRPO steps of the demo from it twice in this process, with GRPO_REPORT_TO=trackio and tracking
switched off on every other step: on the odd steps in the first pass, on the even ones in the second. Off, the
dashboard's callback leaves the trainer and TRL's own trackio timings stop. The demo is seeded and tracking
does not change what it samples, so each step does the same work in both passes, once tracked and once not.
A step's time runs from the previous step's end to its own (the previous step's logging, then its sampling,
reward and update). Prints the median over the steps of tracked / untracked, the time the dashboard's
callback took per tracked step, and the CPU time of trackio's background threads (they write what a step
logged to SQLite and sample CPU and memory every 10 s; they run through the untracked steps too, so their
share is reported apart).
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from transformers import TrainerCallback

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "grpo_runs" / "bench-tracking"


def sft_model() -> Path:
    """The demo's SFT model (tiny model, 180 SFT steps), built by `train.py --demo` with one GRPO step."""
    model = OUT / "base" / "sft" / "model"
    if not (model / "config.json").is_file():
        shutil.rmtree(OUT / "base", ignore_errors=True)
        command = [
            sys.executable,
            "train.py",
            "--demo",
            "--output-dir",
            str(OUT / "base"),
            "--max-steps",
            "1",
        ]
        command += ["--eval-steps", "none", "--report-to", "none"]
        env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "HF_HUB_OFFLINE": "1"}
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            sys.exit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    return model


def thread_cpu_seconds(native_id: int) -> float:
    """user + system CPU time of one thread of this process, from /proc."""
    fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def trackio_threads() -> list[threading.Thread]:
    target_module = lambda t: getattr(getattr(t, "_target", None), "__module__", "") or ""
    return [t for t in threading.enumerate() if target_module(t).startswith("trackio")]


class Alternate(TrainerCallback):
    """Tracking on for the steps of one parity, off for the others, and each step's time."""

    def __init__(self, trainer, board, parity: int) -> None:
        self.trainer, self.board, self.parity = trainer, board, parity
        self.ended: float | None = None
        self.last_step = 0
        self.seconds: dict[int, float] = {}
        self.callback_seconds, self.callback_calls = 0.0, 0
        self.thread_seconds = 0.0
        on_log = board.on_log

        def timed_on_log(*args, **kwargs):
            began = time.perf_counter()
            on_log(*args, **kwargs)
            self.callback_seconds += time.perf_counter() - began
            self.callback_calls += 1

        board.on_log = timed_on_log

    def tracked(self, step: int) -> bool:
        return step % 2 == self.parity

    def on_step_end(self, args, state, control, **kwargs):
        # From one step's end to the next: the earlier step's logging (on_log follows on_step_end), then the
        # step's sampling, reward and update. The mode chosen here covers both.
        step, now = state.global_step, time.perf_counter()
        if step == self.last_step:
            return
        if self.ended is not None and step > 3:  # the first steps warm up
            self.seconds[step] = now - self.ended
        self.ended, self.last_step = now, step
        on = self.tracked(step + 1)
        self.trainer.args.report_to = ["trackio"] if on else []
        callbacks = [cb for cb in self.trainer.callback_handler.callbacks if cb is not self.board]
        if on:
            callbacks.insert(callbacks.index(self), self.board)  # where install put it
        self.trainer.callback_handler.callbacks = callbacks  # a new list: the handler iterates the old one

    def on_train_end(self, args, state, control, **kwargs):
        self.thread_seconds = sum(thread_cpu_seconds(t.native_id) for t in trackio_threads())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="GRPO steps of each pass")
    steps = parser.parse_args().steps

    os.environ["HF_HUB_OFFLINE"] = "1"
    model = sft_model()
    import torch

    import dashboard
    import train

    torch.set_num_threads(1)  # as the demo
    install = dashboard.install
    passes = []
    for parity in (1, 0):
        run = OUT / f"tracked-{'odd' if parity else 'even'}"
        shutil.rmtree(run, ignore_errors=True)
        argv = ["--model-id", str(model), "--output-dir", str(run), "--max-steps", str(steps)]
        argv += ["--eval-steps", "none", "--report-to", "trackio", "--save-steps", str(steps)]
        cfg, sources = train.parse_config(argv, {"HF_HUB_OFFLINE": "1"}, demo=True)

        def install_and_alternate(trainer, *args, parity=parity, **kwargs):
            board = install(trainer, *args, **kwargs)
            passes.append(Alternate(trainer, board, parity))
            trainer.add_callback(passes[-1])
            return board

        dashboard.install = install_and_alternate
        train.train(cfg, sources)

    first, second = passes
    ratios = []
    for step in sorted(set(first.seconds) & set(second.seconds)):
        on, off = (p.seconds[step] for p in sorted(passes, key=lambda p: not p.tracked(step)))
        ratios.append(on / off)
    tracked = [p.seconds[k] for p in passes for k in p.seconds if p.tracked(k)]
    untracked = [p.seconds[k] for p in passes for k in p.seconds if not p.tracked(k)]
    print()
    low, _, high = statistics.quantiles(ratios, n=4)
    print("| steps, each both ways | median s, tracked | untracked | tracked / untracked: median | IQR |")
    print("|---|---|---|---|---|")
    print(
        f"| {len(ratios)} | {statistics.median(tracked):.3f} | {statistics.median(untracked):.3f} | "
        f"{statistics.median(ratios):.3f} | {low:.3f} - {high:.3f} |"
    )
    calls = sum(p.callback_calls for p in passes)
    print(
        f"dashboard callback: {sum(p.callback_seconds for p in passes) / calls * 1000:.1f} ms a tracked step"
    )
    for p in passes:
        print(f"trackio's background threads: {p.thread_seconds:.2f} CPU s over a pass of {steps} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
