"""What the base models do (the seed's option B, for real): Qwen2.5-Coder-0.5B and 1.5B-Instruct as `make
real-model` makes them, on the CPU, before any training.

    .venv/bin/python bench/real_model_baseline.py 0.5b 1.5b   # each model's evaluations that are missing
    .venv/bin/python bench/real_model_baseline.py --table     # baseline.md from the committed files

Three evaluations a model, each made once and kept in bench/results/real_model/baseline/SIZE/:
- eval_heldout.jsonl: data/heldout.jsonl's 48 problems x 4 samples, seed 0, the training prompt and sampling
  at their defaults (temperature 0.9, up to 512 tokens);
- eval_multipl_e.jsonl: MultiPL-E's even half of HumanEval-OCaml with MultiPL-E's own protocol, greedy, with
  REPAIR_PROBLEMS=1 (the problems whose tests still cannot pass are left out, and counted);
- eval_multipl_e_published.jsonl: the same on the problems as MultiPL-E publishes them (no repairs);
- eval_training.jsonl: a fixed sample of the training set, data/problems.jsonl (20 problems drawn by seed 0),
  made as eval_heldout.jsonl is: how hard the set is for the models it is meant for.

MultiPL-E's own harness counts a problem whose tests cannot pass as a failure; the table gives that figure
beside the one over the usable problems. Every figure comes from the Q4_K_M weights, dequantized.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.real_model_learning import MULTIPL_E_EVEN, RESULTS, TRAINING_SAMPLE, K, evaluation  # noqa: E402
from eval_stats import summarize  # noqa: E402
from evaluate import read_rows  # noqa: E402
from real_model import MODELS  # noqa: E402
from rewards import STAGES  # noqa: E402

BASELINE = RESULTS / "baseline"
NAMES = ("heldout", "multipl_e", "multipl_e_published", "training")


def evaluate_missing(size: str) -> None:
    """The model's evaluations that are not in BASELINE/SIZE yet; each one's minutes go into minutes.json."""
    model, into = MODELS[size], BASELINE / size
    if not model.folder.is_dir():
        raise SystemExit(f"no {model.folder}: run `make real-model MODEL={size}` first")
    minutes_file = into / "minutes.json"
    for name in NAMES:
        if (into / f"eval_{name}.jsonl").is_file():
            continue
        started = time.monotonic()
        evaluation(model.folder, name, into, into / "evaluate.log", tokens=512)
        minutes = json.loads(minutes_file.read_text()) if minutes_file.is_file() else {}
        minutes[name] = round((time.monotonic() - started) / 60, 1)
        minutes_file.write_text(json.dumps(minutes, indent=1) + "\n")
        print(f"{size} {name}: {minutes[name]} min", flush=True)


def multipl_e_cell(rows: list[dict], total: int) -> str:
    """pass@1 over the usable problems, the problems left out, and pass@1 with those counted as failures."""
    usable = summarize(rows, 1)
    broken = total - usable["problems"]
    counted = usable["pass@1"] * usable["problems"] / total
    return f"{usable['pass@1']:.1%} of {usable['problems']} ({broken} left out); {counted:.1%} of {total}"


def heldout_row(label: str, rows: list[dict]) -> str:
    s = summarize(rows, K)
    by_difficulty = " / ".join(f"{s['difficulty'][d]['pass@1']:.1%}" for d in ("easy", "medium", "hard"))
    cells = [label, f"{s['pass@1']:.1%}", f"{s[f'pass@{K}']:.1%}", f"{s['mean_reward']:.3f}", by_difficulty]
    return "| " + " | ".join(cells + [f"{s['stages'][stage]:.0%}" for stage in STAGES]) + " |"


def training_row(label: str, rows: list[dict]) -> str:
    """pass@1 and pass@K, the shares of problems solved at least once in K and never, the mean reward."""
    s = summarize(rows, K)
    solved = s[f"pass@{K}"]  # with K samples a problem, pass@K is the share solved at least once
    cells = [label, f"{s['pass@1']:.1%}", f"{solved:.1%}", f"{1 - solved:.1%}", f"{s['mean_reward']:.3f}"]
    by_difficulty = " / ".join(f"{s['difficulty'][d][f'pass@{K}']:.0%}" for d in ("easy", "medium", "hard"))
    return "| " + " | ".join([*cells, by_difficulty]) + " |"


def table() -> str:
    """baseline.md: each model's held-out figures and stage shares, its MultiPL-E figures, the minutes."""
    total = sum(1 for line in MULTIPL_E_EVEN.read_text(encoding="utf-8").splitlines() if line.strip())
    heldout = [
        f"| model | pass@1 | pass@{K} | mean reward | pass@1 easy / medium / hard | {' | '.join(STAGES)} |",
        "|---|---|---|---|---|" + "---|" * len(STAGES),
    ]
    multipl_e = ["| model | repaired (REPAIR_PROBLEMS=1) | as published |", "|---|---|---|"]
    training = [
        f"| model | pass@1 | pass@{K} (solved at least once) | never solved | mean reward "
        f"| pass@{K} easy / medium / hard |",
        "|---|---|---|---|---|---|",
    ]
    minutes = ["| model | " + " | ".join(NAMES) + " |", "|---|" + "---|" * len(NAMES)]
    for size in MODELS:
        files = {name: BASELINE / size / f"eval_{name}.jsonl" for name in NAMES}
        label = f"Qwen2.5-Coder-{size.upper()}-Instruct (Q4_K_M)"
        if files["heldout"].is_file():
            heldout.append(heldout_row(label, read_rows(files["heldout"])))
        if files["multipl_e"].is_file() and files["multipl_e_published"].is_file():
            sampled = ("multipl_e", "multipl_e_published")
            cells = [multipl_e_cell(read_rows(files[name]), total) for name in sampled]
            multipl_e.append(f"| {label} | " + " | ".join(cells) + " |")
        if files["training"].is_file():
            training.append(training_row(label, read_rows(files["training"])))
        timing = BASELINE / size / "minutes.json"
        taken = json.loads(timing.read_text()) if timing.is_file() else {}
        minutes.append(f"| {label} | " + " | ".join(str(taken.get(n, "not measured")) for n in NAMES) + " |")
    parts = [
        f"data/heldout.jsonl: 48 problems x {K} samples, the training prompt, temperature 0.9, up to 512 "
        "tokens; the share of completions at each stage",
        "\n".join(heldout),
        f"MultiPL-E's HumanEval-OCaml, even half ({total} problems), its own protocol, greedy pass@1: over "
        "the usable problems, then with the left-out ones counted as failures, as MultiPL-E's harness does",
        "\n".join(multipl_e),
        f"data/problems.jsonl, the training set: {TRAINING_SAMPLE} problems drawn by seed 0 x {K} samples, "
        "made as the held-out evaluation is",
        "\n".join(training),
        "Minutes each evaluation took on the 2-core machine",
        "\n".join(minutes),
    ]
    return "\n\n".join(parts) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sizes", nargs="*", metavar="SIZE", help=f"models to evaluate: {', '.join(MODELS)}")
    parser.add_argument("--table", action="store_true", help="write baseline.md and exit")
    args = parser.parse_args()
    if unknown := [size for size in args.sizes if size not in MODELS]:
        parser.error(f"no model {', '.join(unknown)}; the models: {', '.join(MODELS)}")
    if not args.table:
        if not MULTIPL_E_EVEN.is_file():
            parser.error(f"needs {MULTIPL_E_EVEN}")
        for size in args.sizes:
            evaluate_missing(size)
    (BASELINE / "baseline.md").write_text(table(), encoding="utf-8")
    print((BASELINE / "baseline.md").read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
