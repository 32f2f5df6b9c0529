"""Can the model solve these problems at all? The seed's option B, before (or instead of) more GRPO steps.

    python test_base_model.py --model ID_OR_PATH [--adapter DIR] [--problems FILE] [-n 10] [-k 4]

Samples k completions for n random problems with the training prompt and sampling settings (GRPO_TEMPERATURE,
GRPO_MAX_COMPLETION, MIN_NON_EMPTY_LINES... from the environment, as train.py reads them), scores them with
the training reward, and prints pass@1, pass@k, mean reward and the share of completions reaching each
reward stage. With --adapter it scores the model with the LoRA adapter too, on the same problems. Every
completion and its breakdown goes to a JSONL file.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import config
from config import ConfigError
from rewards import STAGES, score_batch
from train import TrainConfig, build_prompt_messages, load_problems

SUCCESS_FLOOR = 0.20  # the seed: below this the base model, not the RL setup, is the problem


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c pass (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def sample_problems(problems: list[dict], n: int, seed: int) -> list[dict]:
    return random.Random(seed).sample(problems, min(n, len(problems)))


def generate(model, tokenizer, problem: str, k: int, cfg: TrainConfig) -> list[tuple[str, bool]]:
    """k sampled completions for one problem as (text, truncated), with the prompt train.py uses."""
    import torch

    messages = build_prompt_messages(problem, min_lines=cfg.min_non_empty_lines)
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    inputs = tokenizer(text, return_tensors="pt", add_special_tokens=False).to(model.device)
    with torch.no_grad():
        output = model.generate(
            **inputs,
            do_sample=True,
            temperature=cfg.temperature,
            max_new_tokens=cfg.max_completion_length,
            num_return_sequences=k,
            pad_token_id=tokenizer.pad_token_id,
        )
    completions = []
    for ids in output[:, inputs["input_ids"].shape[1] :]:
        # A completion that used every allowed token without ending is what the reward calls truncated.
        ended = ((ids == tokenizer.eos_token_id) | (ids == tokenizer.pad_token_id)).any().item()
        completions.append((tokenizer.decode(ids, skip_special_tokens=True), not ended))
    return completions


def evaluate(model, tokenizer, problems: list[dict], k: int, cfg: TrainConfig, seed: int) -> list[dict]:
    """One row per completion: the problem, the sample, and the reward's breakdown."""
    import torch

    torch.manual_seed(seed)  # base and base+adapter draw from the same random stream
    items = []
    for p in problems:
        for i, (completion, truncated) in enumerate(generate(model, tokenizer, p["problem"], k, cfg)):
            items.append(
                {
                    "problem_id": p["id"],
                    "sample": i,
                    "problem": p["problem"],
                    "tests": p["tests"],
                    "completion": completion,
                    "truncated": truncated,
                }
            )
    scores = score_batch(items, cfg)
    return [
        {"problem_id": it["problem_id"], "sample": it["sample"], "completion": it["completion"], **score}
        for it, score in zip(items, scores, strict=True)
    ]


def summarize(rows: Sequence[dict], k: int) -> dict:
    """pass@1, pass@k (a completion succeeds when it passes every test), mean reward, stage shares."""
    per_problem: dict[str, list[bool]] = {}
    for r in rows:
        per_problem.setdefault(str(r["problem_id"]), []).append(r["stage"] == "passed")
    counts = Counter(r["stage"] for r in rows)
    return {
        "problems": len(per_problem),
        "completions": len(rows),
        "pass@1": sum(pass_at_k(len(s), sum(s), 1) for s in per_problem.values()) / len(per_problem),
        f"pass@{k}": sum(pass_at_k(len(s), sum(s), k) for s in per_problem.values()) / len(per_problem),
        "mean_reward": sum(r["total_reward"] for r in rows) / len(rows),
        "stages": {stage: counts[stage] / len(rows) for stage in STAGES},
    }


def table(summaries: dict[str, dict], k: int) -> str:
    header = ["model", "pass@1", f"pass@{k}", "mean reward", *STAGES]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, s in summaries.items():
        cells = [label, f"{s['pass@1']:.1%}", f"{s[f'pass@{k}']:.1%}", f"{s['mean_reward']:.3f}"]
        cells += [f"{s['stages'][stage]:.0%}" for stage in STAGES]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


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


def load_model(model_id: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_id)
        model = AutoModelForCausalLM.from_pretrained(model_id, dtype="auto")
    except (OSError, ValueError) as err:
        raise ConfigError(f"--model {model_id!r}: cannot load it ({' '.join(str(err).split())})") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to("cuda" if torch.cuda.is_available() else "cpu").eval(), tokenizer


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
        cfg = config.from_env(TrainConfig)
        if args.adapter and not (args.adapter / "adapter_config.json").is_file():
            raise ConfigError(f"--adapter {str(args.adapter)!r}: no adapter_config.json there")
        problems = sample_problems(load_problems(args.problems or cfg.training_dataset), args.n, args.seed)
        if not problems:
            raise ConfigError(f"{args.problems or cfg.training_dataset}: no usable problems")
        model_id = args.model or cfg.model_id
        model, tokenizer = load_model(model_id)
        results = {"base": evaluate(model, tokenizer, problems, args.k, cfg, args.seed)}
        if args.adapter:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(args.adapter)).eval()
            results["base+adapter"] = evaluate(model, tokenizer, problems, args.k, cfg, args.seed)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    out = args.out or Path(cfg.output_dir) / "base_model_eval.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for label, rows in results.items():
            f.writelines(json.dumps({"model": label, **r}, default=str) + "\n" for r in rows)
    summaries = {label: summarize(rows, args.k) for label, rows in results.items()}
    print(
        f"{model_id}: {len(problems)} problems x {args.k} samples, temperature {cfg.temperature}, "
        f"up to {cfg.max_completion_length} new tokens\n"
    )
    print(table(summaries, args.k))
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
