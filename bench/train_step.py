"""GRPO step time at the seed's settings: train.py's own run on a random model of Qwen2.5-Coder-1.5B's shape,
for each sampling path (GRPO_GENERATION) and gradient-checkpointing setting, in one process.

No weights can be downloaded, so the model is built locally from the architecture's public config values,
randomly initialised in bf16, with the demo's tokenizer. It trains on the bundled problems at the seed's
settings (4 prompts x 6 completions per step, completions up to 512 tokens, LoRA r 32 on all seven
projections). Generation and reward are timed by wrapping the GRPOTrainer methods that do them; the update
is the rest of TRL's `step_time`. A random model never samples its end-of-sequence token, so every
completion runs to the length limit: the worst case for generation. For compiled sampling it also checks
that the base weights after the run are those before its first sampling, bit for bit (the sampler writes
none), and, once, the sampler's log-probabilities of 24 completions it sampled against the trainer's
forward, with the LoRA given a real effect. The first-step compile column is `-` for plain sampling.

    .venv/bin/python bench/train_step.py     # on a GPU box: plain and compiled, checkpointing on and off
    .venv/bin/python bench/train_step.py --generation compiled --gradient-checkpointing off --steps 20
    .venv/bin/python bench/train_step.py --tiny   # the tests' tiny model on the CPU: a smoke run
"""

import argparse
import gc
import json
import os
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

import demo  # noqa: E402
import prompts  # noqa: E402
import train  # noqa: E402
from generation import CompiledSampler  # noqa: E402
from problems import BUNDLED_PROBLEMS, load_problems  # noqa: E402

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

BATCH, GENERATIONS, MAX_PROMPT, MAX_COMPLETION = 4, 6, 704, 512
SEED_SETTINGS = [
    *("--batch-size", str(BATCH), "--num-generations", str(GENERATIONS), "--grad-accum-steps", "1"),
    *("--max-completion", str(MAX_COMPLETION), "--max-prompt", str(MAX_PROMPT)),
    *("--learning-rate", "5e-6", "--temperature", "0.9"),
    *("--lora-r", "32", "--lora-alpha", "64"),
    *("--lora-target-modules", "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"),
]


def build_random_qwen(path: Path) -> Path:
    """Qwen2.5-Coder-1.5B's architecture with random bf16 weights and the demo's tokenizer (its 2,048
    tokens are a subset of the model's 151,936 ids; ids beyond them decode to nothing)."""
    tokenizer = AutoTokenizer.from_pretrained(demo.build_tiny_model(path.parent / "tiny-model"))
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


def base_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A CPU copy of every weight but the LoRA's (kept off the GPU, so that its peak memory is training's)."""
    return {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if "lora_" not in n}


def peak_memory_gib() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def device_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"CPU, torch threads: {torch.get_num_threads()}"


def step_table(
    metrics: list[dict], generation: dict[int, float], reward: dict[int, float], compiled: bool
) -> dict:
    """Means over the steps after the first (a warm-up), from metrics.jsonl rows and the method timings; the
    compile column is how much longer the first step's generation took than the mean of the others, for
    compiled sampling (`-` for the others, which compile nothing: there the difference is only noise)."""
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
        "peak memory GiB": peak_memory_gib(),
        "first-step compile s": generation[steps[0]["step"]] - statistics.mean(gen) if compiled else "-",
    }


def timed_run(flags: list[str], out: Path) -> tuple[dict, GRPOTrainer, bool]:
    """train.py's run with `flags`: its table row, its trainer, and whether the base weights after the run
    equal those before its first sampling, bit for bit."""
    generation, reward = defaultdict(float), defaultdict(float)
    first: dict = {}

    def remember_first(method: Callable) -> Callable:
        """`method`, taking the trainer and its base weights on the first call (outside the timing)."""

        def wrapper(trainer, *args, **kwargs):
            if not first:
                first.update(trainer=trainer, weights=base_weights(trainer.model))
            return method(trainer, *args, **kwargs)

        return wrapper

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()  # each run's own peak
    with (
        mock.patch.object(GRPOTrainer, "_generate", remember_first(timed(GRPOTrainer._generate, generation))),
        mock.patch.object(GRPOTrainer, "_calculate_rewards", timed(GRPOTrainer._calculate_rewards, reward)),
    ):
        # An empty environment: the shell's .envrc must not change the seed's settings.
        if train.main([*flags, "--output-dir", str(out)], environ={}) != 0:
            raise SystemExit(1)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    after = base_weights(first["trainer"].model)
    unchanged = all(torch.equal(first["weights"][n], after[n]) for n in after)
    compiled = flags[flags.index("--generation") + 1] == "compiled"
    return step_table(metrics, generation, reward, compiled), first["trainer"], unchanged


def give_lora_an_effect(model: torch.nn.Module, std: float, seed: int = 0) -> None:
    """PEFT starts every lora_B at zero, where the LoRA changes nothing; draw them from N(0, std^2)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "lora_B" in name:
                weight.copy_(torch.randn(weight.shape, generator=generator) * std)


def trainer_logprobs(
    trainer: GRPOTrainer, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_ids: torch.Tensor
) -> torch.Tensor:
    """TRL's own per-token log-probabilities of the completions (its training forward, under its autocast),
    in eval mode: the policy without LoRA dropout."""
    model = trainer.model
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logps, _, _ = trainer._get_per_token_logps_and_entropies(
                model,
                torch.cat([input_ids, completion_ids], dim=1),
                torch.cat([attention_mask, torch.ones_like(completion_ids)], dim=1),
                logits_to_keep=completion_ids.shape[1],
                batch_size=BATCH,
            )
    finally:
        model.train(training)
    return logps


def prompt_batch(tokenizer, problems: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """The problems' training prompts as TRL batches them: token ids and attention mask, left-padded."""
    texts = [
        tokenizer.apply_chat_template(
            prompts.build_prompt_messages(p["problem"]), tokenize=False, add_generation_prompt=True
        )
        for p in problems
    ]
    batch = tokenizer(texts, add_special_tokens=False, padding=True, padding_side="left", return_tensors="pt")
    return batch["input_ids"], batch["attention_mask"]


def sampler_agreement(trainer: GRPOTrainer) -> tuple[float, int, float]:
    """(max |sampler - trainer| log-probability, tokens compared, the LoRA's own max effect) over one round
    of 24 completions the compiled sampler draws, with lora_B of std 0.01 (a delta of about a tenth of the
    random weights')."""
    model, tokenizer = trainer.model, trainer.processing_class
    give_lora_an_effect(model, std=0.01)
    problems = load_problems(str(BUNDLED_PROBLEMS))[:BATCH]
    ids, mask = prompt_batch(tokenizer, [p for p in problems for _ in range(GENERATIONS)])
    ids, mask = ids.to(model.device), mask.to(model.device)
    sampler = CompiledSampler(MAX_PROMPT)
    completions = sampler.generate(model, ids, mask, trainer.generation_config)[:, ids.shape[1] :]
    # Up to the first end token, as TRL keeps them.
    ended = (completions == tokenizer.eos_token_id).int().cumsum(dim=1)
    kept = (ended - (completions == tokenizer.eos_token_id).int()) == 0
    sampled = sampler.token_logprobs(model, ids, mask, completions, trainer.generation_config)
    trained = trainer_logprobs(trainer, ids, mask, completions)
    with model.disable_adapter():
        base = trainer_logprobs(trainer, ids, mask, completions)
    return (
        (sampled - trained).abs()[kept].max().item(),
        int(kept.sum()),
        (base - trained).abs()[kept].max().item(),
    )


def choices(allowed: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(value: str) -> list[str]:
        picked = value.split(",")
        if not picked or any(choice not in allowed for choice in picked):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(allowed)}")
        return picked

    return parse


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--steps", type=int, help="optimizer steps per run (default 6; 3 with --tiny); at least 2"
    )
    parser.add_argument("--tiny", action="store_true", help="the demo's tiny model, for the CPU")
    parser.add_argument(
        "--generation",
        type=choices(("plain", "compiled", "vllm")),
        default=["plain", "compiled"],
        help="sampling paths, each a run (default plain,compiled)",
    )
    parser.add_argument(
        "--gradient-checkpointing",
        type=choices(("on", "off")),
        default=["on", "off"],
        help="checkpointing settings, each a run per sampling path (default on,off)",
    )
    args = parser.parse_args()
    steps = args.steps or (3 if args.tiny else 6)
    if steps < 2:
        parser.error("--steps: at least 2 (the first is a warm-up, left out of the means)")
    if args.tiny:
        torch.set_num_threads(1)  # as the demo: the tiny model gains nothing from a second, shared core

    rows, checks = [], []
    with tempfile.TemporaryDirectory() as tmp:
        # A cold compiler cache, so the first compiled run's compile time is a first run's; later runs in
        # this process reuse it, as a second training run on the same machine would.
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(tmp) / "inductor-cache")
        build = demo.build_tiny_model if args.tiny else build_random_qwen
        model_dir = build(Path(tmp) / "model")
        flags = [
            *("--model-id", str(model_dir), "--training-dataset", str(BUNDLED_PROBLEMS)),
            *("--max-steps", str(steps), "--save-steps", str(steps + 1), "--eval-steps", "none"),
            # No tracker: its logging is not the step's cost, and TRL's profiling of the sampler check
            # after the run would log to a tracker already finished.
            *("--report-to", "none"),
            *SEED_SETTINGS,
        ]
        for generation in args.generation:
            for checkpointing in args.gradient_checkpointing:
                path = ["--generation", generation, "--gradient-checkpointing", checkpointing]
                out = Path(tmp) / f"run-{generation}-{checkpointing}"
                row, trainer, unchanged = timed_run([*flags, *path], out)
                rows.append({"sampling": generation, "checkpointing": checkpointing, **row})
                if generation == "compiled":
                    checks.append(
                        f"compiled, checkpointing {checkpointing}: base weights bit-identical after {steps} "
                        f"steps: {'yes' if unchanged else 'NO'}"
                    )
                if generation == "compiled" and not any("log-prob" in line for line in checks):
                    difference, tokens, effect = sampler_agreement(trainer)
                    dtype = str(trainer.model.dtype).removeprefix("torch.")
                    checks.append(
                        f"compiled sampler vs trainer's forward ({dtype}, {tokens} completion tokens): max "
                        f"|log-prob difference| {difference:.2e}; the LoRA's own effect {effect:.2f}"
                    )
                del trainer
                gc.collect()
                torch._dynamo.reset()  # the next run's model is a new object: its own compile, measured
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()

    memory_source = "torch.cuda.max_memory_allocated per run"
    if not torch.cuda.is_available():
        memory_source = "CPU run: the process's peak RSS so far (it only grows)"
    model = "demo's tiny model (--tiny)" if args.tiny else "random Qwen2.5-Coder-1.5B architecture, bf16"
    print(
        f"\n{model}; means of steps 2-{steps} of each run (step 1 is a warm-up); peak memory: {memory_source}"
    )
    print(
        "Random weights rarely sample the end token, so completions run to or near the limit of "
        f"{MAX_COMPLETION} tokens (completion tokens): the worst case for generation."
    )
    print("\n| device | " + " | ".join(rows[0]) + " |")
    print("|---" * (len(rows[0]) + 1) + "|")
    for row in rows:
        cells = [
            v if isinstance(v, str) else f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}" for v in row.values()
        ]
        print(f"| {device_name()} | " + " | ".join(cells) + " |")
    print("\n" + "\n".join(checks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
