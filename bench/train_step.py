"""GRPO step time at the seed's settings: train.py's own run on a random model of Qwen2.5-Coder-1.5B's shape.

No weights can be downloaded, so the model is built locally from the architecture's public config values,
randomly initialised in bf16, with the demo's tokenizer. It trains on the bundled problems at the seed's
settings (4 prompts x 6 completions per step, completions up to 512 tokens, LoRA r 32 on all seven
projections). Generation and reward are timed by wrapping the GRPOTrainer methods that do them; the update
is the rest of TRL's `step_time`. A random model never samples its end-of-sequence token, so every
completion runs to the length limit: the worst case for generation.

    .venv/bin/python bench/train_step.py [--steps 20]   # on a GPU box
    .venv/bin/python bench/train_step.py --tiny          # the demo's tiny model on the CPU: a smoke run
"""

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config
from trl import GRPOTrainer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import train  # noqa: E402

# Qwen/Qwen2.5-Coder-1.5B-Instruct's config.json, less the token ids (the tokenizer's are used).
QWEN_CODER_1_5B = {
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "use_sliding_window": False,
}

BATCH, GENERATIONS, MAX_COMPLETION = 4, 6, 512
SEED_SETTINGS = [
    *("--batch-size", str(BATCH), "--num-generations", str(GENERATIONS), "--grad-accum-steps", "1"),
    *("--max-completion", str(MAX_COMPLETION), "--max-prompt", "704"),
    *("--learning-rate", "5e-6", "--temperature", "0.9"),
    *("--lora-r", "32", "--lora-alpha", "64"),
    *("--lora-target-modules", "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"),
]


def build_random_qwen(path: Path) -> Path:
    """Qwen2.5-Coder-1.5B's architecture with random bf16 weights and the demo's tokenizer (its 2,048
    tokens are a subset of the model's 151,936 ids; ids beyond them decode to nothing)."""
    tokenizer = AutoTokenizer.from_pretrained(train.build_tiny_model(path.parent / "tiny-model"))
    config = Qwen2Config(
        **QWEN_CODER_1_5B,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    # Initialising 1.5B weights takes seconds on the GPU, about 20 s on two CPU cores.
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def timed(method: Callable, seconds: dict[int, float]) -> Callable:
    """`method`, adding its wall time to `seconds[optimizer step]`; the GPU is synchronised at both ends."""

    def wrapper(trainer, *args, **kwargs):
        synchronize()
        start = time.perf_counter()
        try:
            return method(trainer, *args, **kwargs)
        finally:
            synchronize()
            seconds[trainer.state.global_step + 1] += time.perf_counter() - start

    return wrapper


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def peak_memory_gib() -> tuple[float, str]:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30, "torch.cuda.max_memory_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "CPU run: the process's peak RSS"


def device_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"CPU, torch threads: {torch.get_num_threads()}"


def step_table(metrics: list[dict], generation: dict[int, float], reward: dict[int, float]) -> dict:
    """Means over the steps after the first (a warm-up), from metrics.jsonl rows and the method timings."""
    steps = [m for m in metrics if "step_time" in m]
    timed_steps = steps[1:]
    step_time = [m["step_time"] for m in timed_steps]
    tokens = timed_steps[-1]["num_tokens"] - steps[0]["num_tokens"]  # num_tokens is cumulative
    gen = [generation[m["step"]] for m in timed_steps]
    rew = [reward[m["step"]] for m in timed_steps]
    return {
        "step s": statistics.mean(step_time),
        "generation s": statistics.mean(gen),
        "reward s": statistics.mean(rew),
        "update s": statistics.mean(t - g - r for t, g, r in zip(step_time, gen, rew, strict=True)),
        "tokens/s": tokens / sum(step_time),
        "completions/s": BATCH * GENERATIONS * len(timed_steps) / sum(step_time),
        "completion tokens": statistics.mean(m["completions/mean_length"] for m in timed_steps),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, help="optimizer steps (default 20; 3 with --tiny); at least 2")
    parser.add_argument("--tiny", action="store_true", help="the demo's tiny model, for the CPU")
    args = parser.parse_args()
    steps = args.steps or (3 if args.tiny else 20)
    if steps < 2:
        parser.error("--steps: at least 2 (the first is a warm-up, left out of the means)")
    if args.tiny:
        torch.set_num_threads(1)  # as the demo: the tiny model gains nothing from a second, shared core

    generation, reward = defaultdict(float), defaultdict(float)
    with tempfile.TemporaryDirectory() as tmp:
        build = train.build_tiny_model if args.tiny else build_random_qwen
        model_dir = build(Path(tmp) / "model")
        out = Path(tmp) / "run"
        flags = [
            *("--model-id", str(model_dir), "--training-dataset", str(train.BUNDLED_PROBLEMS)),
            *("--output-dir", str(out), "--max-steps", str(steps), "--save-steps", str(steps + 1)),
            *SEED_SETTINGS,
        ]
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()  # the build's copy of the weights is not training's
        with (
            mock.patch.object(GRPOTrainer, "_generate", timed(GRPOTrainer._generate, generation)),
            mock.patch.object(
                GRPOTrainer, "_calculate_rewards", timed(GRPOTrainer._calculate_rewards, reward)
            ),
        ):
            # An empty environment: the shell's .envrc must not change the seed's settings.
            if train.main(flags, environ={}) != 0:
                return 1
        metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]

    row = step_table(metrics, generation, reward)
    memory, memory_source = peak_memory_gib()
    model = "demo's tiny model (--tiny)" if args.tiny else "random Qwen2.5-Coder-1.5B architecture, bf16"
    print(f"\n{model}; means of steps 2-{steps} (step 1 is a warm-up); peak memory: {memory_source}")
    print(
        f"Random weights rarely sample the end token: completions average {row['completion tokens']:.0f} "
        f"of at most {MAX_COMPLETION} tokens, the worst case for generation."
    )
    cells = [device_name(), *(f"{v:.3g}" if v < 100 else f"{v:.0f}" for v in row.values()), f"{memory:.3g}"]
    print("\n| device | " + " | ".join(row) + " | peak memory GiB |")
    print("|---" * len(cells) + "|")
    print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
