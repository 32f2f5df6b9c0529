"""Can the model solve these problems at all? The seed's option B, before (or instead of) more GRPO steps.

    python test_base_model.py --model ID_OR_PATH [--adapter DIR] [--problems FILE] [-n 10] [-k 4]

Samples k completions for n random training problems with evaluate.py (the training prompt and sampling
settings, the training reward), prints pass@1, pass@k, mean reward and the share of completions reaching
each reward stage, and the seed's rule on whether GRPO has enough to learn from. With --adapter it scores
the model with the LoRA adapter too, on the same problems and seed. Every completion and its breakdown goes
to one JSONL file. For the held-out set, several models and comparisons, use evaluate.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import envflags
from envflags import ConfigError
from eval_stats import summarize
from evaluate import DEFAULT_BATCH_SIZE, evaluate_model, pick_problems, summary_table
from models import load_base, with_adapter
from ocaml_sandbox import ToolchainMissing, check_toolchain
from problems import load_problems
from settings import TrainConfig

SUCCESS_FLOOR = 0.20  # the seed: below this the base model, not the RL setup, is the problem


def decision(label: str, summary: dict) -> str:
    """The seed's rule on pass@1, the share of sampled completions that pass every test."""
    rate = summary["pass@1"]
    if rate < SUCCESS_FLOOR:
        return (
            f"{label}: pass@1 {rate:.1%} is under {SUCCESS_FLOOR:.0%}: the model fails most problems, so "
            "GRPO has little to reinforce. Consider a stronger base model (GRPO_MODEL_ID, e.g. "
            "Qwen/Qwen2.5-Coder-7B-Instruct), an easier subset of problems (shorter solutions), or more "
            "few-shot examples in the prompt."
        )
    return f"{label}: pass@1 {rate:.1%} is at least {SUCCESS_FLOOR:.0%}: the model can learn from this data."


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model id or folder (default: GRPO_MODEL_ID)")
    parser.add_argument("--adapter", type=Path, help="a LoRA adapter folder to compare against the model")
    parser.add_argument("--problems", help="problems file or dataset id (default: TRAINING_DATASET)")
    parser.add_argument("-n", type=int, default=10, help="random problems to try (default 10)")
    parser.add_argument("-k", type=int, default=4, help="completions sampled per problem (default 4)")
    parser.add_argument("--seed", type=int, default=0, help="picks the problems and seeds the sampling")
    parser.add_argument(
        "--out", type=Path, help="completions and scores (default: GRPO_OUTPUT_DIR/base_model_eval.jsonl)"
    )
    args = parser.parse_args(argv)
    if args.n < 1 or args.k < 1:
        parser.error("-n and -k must be at least 1")
    try:
        cfg = envflags.from_env(TrainConfig)
        if args.adapter and not (args.adapter / "adapter_config.json").is_file():
            raise ConfigError(f"--adapter {str(args.adapter)!r}: no adapter_config.json there")
        source = args.problems or cfg.training_dataset
        problems = pick_problems(
            load_problems(source, setting_name="--problems" if args.problems else "TRAINING_DATASET"),
            args.n,
            args.seed,
        )
        if not problems:
            raise ConfigError(f"{args.problems or cfg.training_dataset}: no usable problems")
        check_toolchain()
        model_id = args.model or cfg.model_id
        model, tokenizer = load_base(model_id)
        settings = {"k": args.k, "batch_size": DEFAULT_BATCH_SIZE, "seed": args.seed}
        results = {"base": evaluate_model(model, tokenizer, problems, cfg, **settings)}
        if args.adapter:
            model = with_adapter(model, args.adapter)
            results["base+adapter"] = evaluate_model(model, tokenizer, problems, cfg, **settings)
    except (ConfigError, ToolchainMissing) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    out = args.out or Path(cfg.output_dir) / "base_model_eval.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for label, rows in results.items():
            f.writelines(json.dumps({"model": label, **r}) + "\n" for r in rows)
    summaries = {label: summarize(rows, args.k) for label, rows in results.items()}
    print(
        f"{model_id}: {len(problems)} problems x {args.k} samples, temperature {cfg.temperature}, "
        f"up to {cfg.max_completion_length} new tokens\n"
    )
    print(summary_table(summaries, args.k))
    print()
    for label, summary in summaries.items():
        print(decision(label, summary))
    if "base+adapter" in summaries:
        base, tuned = summaries["base"], summaries["base+adapter"]
        print(
            f"adapter effect: pass@1 {100 * (tuned['pass@1'] - base['pass@1']):+.1f} points, "
            f"mean reward {tuned['mean_reward'] - base['mean_reward']:+.3f}"
        )
    print(f"completions and scores: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
