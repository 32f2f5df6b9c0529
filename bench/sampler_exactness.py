"""How much of the LoRA's effect the compiled sampler samples, at the LoRA sizes a real run has (issue 16).

A random bf16 model with Qwen2.5-Coder-1.5B's layer widths (two layers, the demo's tokenizer) gets a LoRA
r 32 / alpha 64 on all seven projections whose B matrices are where that many Adam steps at lr 5e-6 take
them from zero: each entry moved lr a step, in one direction (the most it can move; a direction that
changes leaves it smaller still). Completions are sampled from the
base model and scored per token by the trainer's forward with the LoRA (T) and without (T0), by the compiled
sampler (generation.py: LoRA unmerged, static cache, compiled step; S, S0), and by the fold generation.py used
before (each delta added to its bf16 weight in float32 and rounded once, adapters off; F).

1. bf16 weights, float32 arithmetic (the bf16 values held in float32): the only rounding is the fold's, so
   T - T0 is the LoRA's exact effect and "lost" = 1 - <X - X0, T - T0> / |T - T0|^2 is the share of it a
   sampler X does not sample (its projection on the effect; 0 is exact).
2. all bf16, as a run on the CPU: the mean |X - T| as a share of the mean |T - T0|, beside the same share
   for S0 against T0 (no LoRA at all: the rounding noise between the sampler's decoding path and the
   trainer's one forward, which a LoRA this small is of the order of).

    .venv/bin/python bench/sampler_exactness.py            # 20, 100, 500 steps (about two minutes)
    .venv/bin/python bench/sampler_exactness.py --steps 20 --layers 1
"""

import argparse
import copy
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, Qwen2Config

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import demo  # noqa: E402
from bench.train_step import QWEN_CODER_1_5B, prompt_batch  # noqa: E402
from generation import CompiledSampler  # noqa: E402
from problems import BUNDLED_PROBLEMS, load_problems  # noqa: E402

SEVEN = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LEARNING_RATE = 5e-6
MAX_PROMPT = 704


def random_model(tokenizer, layers: int) -> PeftModel:
    """Qwen2.5-Coder-1.5B's widths, `layers` layers, random bf16 weights (std 0.02, as the real model's
    are), with a zero-initialised LoRA r 32 / alpha 64 on the seven projections."""
    shape = {**QWEN_CODER_1_5B, "num_hidden_layers": layers, "vocab_size": len(tokenizer)}
    config = Qwen2Config(**shape, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    lora = LoraConfig(r=32, lora_alpha=64, lora_dropout=0.0, target_modules=SEVEN, task_type="CAUSAL_LM")
    return get_peft_model(model, lora).eval()


def set_adam_steps(model: PeftModel, steps: int) -> None:
    """Every lora_B entry `steps` x LEARNING_RATE from zero, with a random sign (Adam's step is about lr per
    entry whatever the gradient's size)."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "lora_B" in name:
                sign = torch.randint(0, 2, weight.shape, generator=generator) * 2 - 1
                weight.copy_(sign * steps * LEARNING_RATE)


@contextmanager
def folded(model: PeftModel) -> Iterator[None]:
    """The fold the sampler used to do: delta added in float32, rounded to bf16 once (kept in the weights'
    dtype: a float32 copy of bf16 weights gets the bf16-rounded values), adapters off."""
    layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
    with torch.no_grad():
        originals = [layer.get_base_layer().weight.detach().clone() for layer in layers]
        for layer in layers:
            weight = layer.get_base_layer().weight
            weight.copy_((weight.float() + layer.get_delta_weight("default").float()).to(torch.bfloat16))
    try:
        with model.disable_adapter():
            yield
    finally:
        with torch.no_grad():
            for layer, original in zip(layers, originals, strict=True):
                layer.get_base_layer().weight.copy_(original)


def forward_logprobs(model, ids: torch.Tensor, mask: torch.Tensor, completion: torch.Tensor) -> torch.Tensor:
    """The trainer's per-token log-probabilities of `completion` (one forward over prompt + completion)."""
    with torch.no_grad():
        full = torch.cat([ids, completion], dim=1)
        logits = model(
            input_ids=full, attention_mask=torch.cat([mask, torch.ones_like(completion)], 1)
        ).logits
        logits = logits[:, ids.shape[1] - 1 : -1].float()
    return logits.log_softmax(-1).gather(2, completion.unsqueeze(2)).squeeze(2)


def lost(logprobs: torch.Tensor, base: torch.Tensor, trained: torch.Tensor) -> float:
    """The share of the LoRA's effect (trained - base) that `logprobs - base` leaves out (its projection)."""
    effect, shift = (trained - base).flatten(), (logprobs - base).flatten()
    return 1 - float(shift @ effect / (effect @ effect))


def mean_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().mean().item()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[20, 100, 500], help="Adam steps")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    parser.add_argument("--tokens", type=int, default=48, help="completion tokens per prompt (default 48)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = AutoTokenizer.from_pretrained(demo.build_tiny_model(Path(tmp) / "tiny"))
    model = random_model(tokenizer, args.layers)
    problems = load_problems(str(BUNDLED_PROBLEMS))[:4]
    ids, mask = prompt_batch(tokenizer, problems)
    config = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=args.tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=None,
        disable_compile=True,
    )
    torch.manual_seed(0)
    with model.disable_adapter(), torch.no_grad():
        completion = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)[
            :, ids.shape[1] :
        ]
    exact = copy.deepcopy(model).float()  # bf16 values, float32 arithmetic
    samplers = {}  # one per model: each keeps its cache, of its model's dtype

    def score(m: PeftModel) -> torch.Tensor:
        sampler = samplers.setdefault(id(m), CompiledSampler(MAX_PROMPT, log=lambda line: None))
        return sampler.token_logprobs(m, ids, mask, completion, config)

    with model.disable_adapter(), exact.disable_adapter():
        base, exact_base = (
            forward_logprobs(model, ids, mask, completion),
            forward_logprobs(exact, ids, mask, completion),
        )
        sampled_base, exact_sampled_base = score(model), score(exact)
    print(
        f"random model, {args.layers} layer(s) of Qwen2.5-Coder-1.5B's widths, LoRA r 32 / alpha 64 on "
        f"7 projections; {completion.numel()} completion tokens; CPU, torch {torch.__version__}\n"
    )
    rows = []
    for steps in args.steps:
        set_adam_steps(model, steps)
        set_adam_steps(exact, steps)
        trained, exact_trained = (
            forward_logprobs(model, ids, mask, completion),
            forward_logprobs(exact, ids, mask, completion),
        )
        unmerged, exact_unmerged = score(model), score(exact)
        with folded(model):
            fold = score(model)
        with folded(exact):
            exact_fold = forward_logprobs(exact, ids, mask, completion)  # the fold's loss is in the weights
        effect = mean_gap(trained, base)
        cells = [
            f"{mean_gap(exact_trained, exact_base):.2e}",
            f"{lost(exact_unmerged, exact_sampled_base, exact_trained):z.2f}",  # no -0.00
            f"{lost(exact_fold, exact_base, exact_trained):z.2f}",
            f"{effect:.2e}",
            f"{mean_gap(unmerged, trained) / effect:.2f}",
            f"{mean_gap(fold, trained) / effect:.2f}",
            f"{mean_gap(sampled_base, base) / effect:.2f}",
        ]
        rows.append(f"| {steps} | " + " | ".join(cells) + " |")
    print(
        "| Adam steps at lr 5e-6 | 1. LoRA effect (mean abs log-prob) | share lost: unmerged sampler | fold "
        "| 2. bf16: LoRA effect | mean gap / effect: unmerged sampler | fold | no LoRA (noise) |"
    )
    print("|---" * 8 + "|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
