"""Sampling from the policy being trained at compiled speed without vLLM; the gradient-checkpointing rule.

TRL's GRPOTrainer samples from the PEFT model as it trains it: LoRA unmerged, a dynamic KV cache and no
torch.compile (its GenerationConfig sets `disable_compile`). On an H100 that is 114 ms per decoding step of
24 sequences; with the LoRA folded into the weights, a static cache and a compiled step it is 8.7 ms (the
probe in issue 11; the unmerged LoRA under compile was 12.7 ms, hence the fold). `CompiledSampler` samples
that way and keeps the policy exact:

- each LoRA delta is added to its base weight in float32 and rounded once, and the adapters are disabled
  while sampling, so the sampler's forward is the trained policy's up to that rounding
  (tests/test_generation.py measures the log-probability difference). LoRA dropout is off, as it is for
  the merged weights TRL hands vLLM;
- the base weights are copied before and copied back after, so they return bit for bit: subtracting the
  delta again in bf16 would not, and the drift would grow over thousands of steps;
- the KV cache is static and of one length for every call (prompt budget + completion budget).
  transformers compiles only the decoding step (the prefill runs eagerly), and the step's shapes are the
  batch size and the cache length, so prompts of any length share one graph and need no padding to length
  buckets: a training run compiles once. Attending over the unused cache positions costs little: at the
  seed's shapes the cache is a fifth of the bytes a decoding step reads, the weights the rest. The cache
  is kept from call to call (0.8 GiB at the seed's shapes): at the same addresses, the CUDA graph recorded
  in the first call is replayed in every later one, where a fresh cache (transformers' way) would have it
  recorded again each call. Every call that compiles is logged with its time; a compile for a shape
  already compiled is logged as a recompilation, so one repeated every step cannot go unseen.

train.py installs the sampler as the PEFT model's `generate`, the one call through which TRL samples
without vLLM. Evaluation code calls `CompiledSampler.generate(model, input_ids, attention_mask, config)`.
"""

from __future__ import annotations

import copy
import functools
import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from peft import PeftModel
from peft.tuners.lora import LoraLayer
from torch._dynamo.utils import counters  # dynamo's own tally of compiled graphs; no public equivalent
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    CompileConfig,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    StaticCache,
)


@contextmanager
def folded_lora(model: PreTrainedModel | PeftModel) -> Iterator[PreTrainedModel]:
    """The model to sample from, in eval mode: a PEFT model's base model with every active LoRA delta added
    to its weight and the adapters disabled, or a plain model as it is. On exit the base weights are copied
    back from a copy taken before the fold, so they are bit-identical, and the training mode is restored."""
    training = model.training
    # One mode for every call, so TRL (train mode) and an evaluation loop (eval mode) share the compiled
    # graph, which dynamo guards on `training`; and no dropout in sampling.
    model.eval()
    try:
        if not isinstance(model, PeftModel):
            yield model
            return
        layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
        with torch.no_grad():
            # Copies on the same device: copying back is a few milliseconds even for 1.5B parameters.
            originals = [layer.get_base_layer().weight.detach().clone() for layer in layers]
            for layer in layers:
                weight = layer.get_base_layer().weight
                deltas = [layer.get_delta_weight(name).float() for name in layer.active_adapters]
                # In place, so the compiled graph (and its CUDA graphs) keeps reading the same storage.
                weight.copy_(weight.float() + sum(deltas))
        try:
            with model.disable_adapter():
                yield model.get_base_model()
        finally:
            with torch.no_grad():
                for layer, original in zip(layers, originals, strict=True):
                    layer.get_base_layer().weight.copy_(original)
    finally:
        model.train(training)


@contextmanager
def hooks_set_aside(embeddings: torch.nn.Module) -> Iterator[None]:
    """The input embeddings without their forward hooks, which are put back on exit. Those hooks make the
    embeddings' output require grad for the backward pass, which sampling has none of. transformers 5.23
    adds one each time gradient checkpointing is enabled, and TRL enables it again after every sampling
    round without the old one being removed (two more hooks a step), so left in place their number would
    change dynamo's guards, and the decoding step would be recompiled every step."""
    hooks = embeddings._forward_hooks  # no public API lists a module's hooks
    kept = dict(hooks)
    hooks.clear()
    try:
        yield
    finally:
        hooks.update(kept)


class CompiledSampler:
    """`generate` through the folded policy with a static KV cache and transformers' compiled decoding step.

    `log` receives one line for every call that compiled (a new batch size, or a recompilation)."""

    def __init__(self, max_prompt_length: int, log: Callable[[str], None] = print) -> None:
        self.max_prompt_length = max_prompt_length
        self.log = log
        self.caches: dict[tuple[int, int], StaticCache] = {}  # by (batch size, cache length)
        self.compiled_shapes: set[tuple[int, int]] = set()

    def install(self, model: PeftModel) -> None:
        """Make this sampler `model.generate`. TRL's GRPOTrainer samples (without vLLM) by calling `generate`
        on the model `unwrap_model_for_generation` hands it, which is this object (accelerate and DDP wrap
        it, they do not replace it), so an attribute on it is the narrowest hook: no TRL code replaced or
        copied, and TRL's vLLM path never reaches it."""
        model.generate = functools.partial(self.generate, model)

    def generation_config(self, config: GenerationConfig, device: torch.device) -> GenerationConfig:
        """`config` with compilation allowed, for the sampler's own static cache."""
        if config.max_new_tokens is None:
            raise ValueError("CompiledSampler needs a GenerationConfig with max_new_tokens")
        config = copy.deepcopy(config)
        config.cache_implementation = None  # the cache is passed in
        config.disable_compile = False  # TRL sets it; transformers compiles the step with a static cache
        if device.type == "cpu":
            # transformers compiles on CUDA only. On the CPU the same graph capture runs (dynamo, its
            # guards and recompilations) without code generation: inductor's C++ build takes 35 s for even
            # the 2-layer test model, and this path exists on the CPU to be tested, not to be fast.
            config.compile_config = CompileConfig(backend="eager", mode=None)
            config.compile_config._compile_all_devices = True  # transformers' switch for compiling on CPU
        return config

    def generate(
        self,
        model: PreTrainedModel | PeftModel,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        generation_config: GenerationConfig,
        **kwargs,
    ):
        """`model.generate` (left-padded prompts, same output layout: prompt then completion) from the
        folded policy; `kwargs` go to transformers' generate."""
        config = self.generation_config(generation_config, input_ids.device)
        shape = (input_ids.shape[0], max(self.max_prompt_length, input_ids.shape[1]) + config.max_new_tokens)
        graphs = counters["stats"]["unique_graphs"]
        started = time.perf_counter()
        with folded_lora(model) as policy, hooks_set_aside(policy.get_input_embeddings()), torch.no_grad():
            if shape not in self.caches:
                self.caches[shape] = StaticCache(config=policy.config, max_cache_len=shape[1])
            cache = self.caches[shape]
            cache.reset()
            output = policy.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                past_key_values=cache,
                generation_config=config,
                **kwargs,
            )
        new_graphs = counters["stats"]["unique_graphs"] - graphs
        if new_graphs:
            seen = shape in self.compiled_shapes
            what = "recompiled (TORCH_LOGS=recompiles says why)" if seen else "compiled"
            self.log(
                f"sampling {what}: {new_graphs} graph(s) for {shape[0]} sequences x {shape[1]} cache "
                f"positions; this call took {time.perf_counter() - started:.1f} s"
            )
            self.compiled_shapes.add(shape)
        return output

    def token_logprobs(
        self,
        model: PreTrainedModel | PeftModel,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        completion_ids: torch.Tensor,
        generation_config: GenerationConfig,
    ) -> torch.Tensor:
        """Log-probabilities (batch, completion length) that this sampler's distribution gives
        `completion_ids` after the prompts: the completions are forced token by token through `generate`
        (same weights, cache and compiled step as sampling) and each step's logits divided by the
        temperature, as TRL's trainer scores them. Measures that the sampler samples the policy trained."""
        config = copy.deepcopy(generation_config)
        config.max_new_tokens = completion_ids.shape[1]
        config.eos_token_id = None  # an end token inside the forced completion must not stop it
        forced = _ForcedTokens(completion_ids, input_ids.shape[1], config.temperature)
        self.generate(
            model, input_ids, attention_mask, config, logits_processor=LogitsProcessorList([forced])
        )
        return torch.cat(forced.logprobs, dim=1)


class _ForcedTokens(LogitsProcessor):
    """Records the log-probability of the given token at each step, then leaves only that token possible,
    so that sampling follows a fixed completion. transformers runs the processors given to `generate`
    before its temperature and top-k/top-p warpers: the scores seen here are the model's logits."""

    def __init__(self, tokens: torch.Tensor, prompt_length: int, temperature: float) -> None:
        self.tokens, self.prompt_length, self.temperature = tokens, prompt_length, temperature
        self.logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        token = self.tokens[:, input_ids.shape[1] - self.prompt_length].unsqueeze(1)
        self.logprobs.append((scores.float() / self.temperature).log_softmax(-1).gather(1, token))
        return torch.full_like(scores, -math.inf).scatter(1, token, 0.0)


# ------------------------------------------------------------------------------------------------------------
# Gradient checkpointing. It saves memory in the update and costs time: on the H100, one seed-settings
# update took 2.51 s at 8.5 GiB peak with it and 1.46 s at 24.7 GiB without (issue 11).

# Activation bytes kept for the backward pass per token, per layer and per unit of hidden_size +
# intermediate_size, in bf16 without checkpointing: the 16.2 GiB between those two peaks over 4 sequences of
# about 960 tokens (450 prompt + 512 completion) through the 28 layers of width 1,536 + 8,960 is 15.7.
ACTIVATION_BYTES = 16
# Everything but the activations, as a multiple of the weights: the H100 peak with checkpointing was 8.5 GiB
# for 2.9 GiB of weights, with TRL's sampling. The compiled sampler adds its cache (0.8 GiB at the seed's
# shapes) and, only while it samples, when no activations are held, a copy of the adapted weights (2.6 GiB).
WEIGHT_COPIES = 3
MEMORY_SHARE = 0.8  # the rest for the allocator's fragmentation, the CUDA context and compiled graphs


def update_peak_bytes(model_id: str, tokens_per_pass: int) -> int:
    """Estimated peak memory of a GRPO run without gradient checkpointing, from the model's config alone
    (the weights counted on the meta device, nothing loaded); tokens_per_pass is the update's batch times
    the longest sequence (prompt + completion budgets)."""
    config = AutoConfig.from_pretrained(model_id)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=config.dtype)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    text = config.get_text_config()
    width = text.hidden_size + text.intermediate_size
    return WEIGHT_COPIES * weights + ACTIVATION_BYTES * text.num_hidden_layers * width * tokens_per_pass


def device_memory(device: torch.device) -> int:
    """Bytes of the device the run trains on: the GPU's, or the machine's RAM for the CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def gradient_checkpointing(
    choice: str, model_id: str, tokens_per_pass: int, memory_bytes: int
) -> tuple[bool, str]:
    """GRPO_GRADIENT_CHECKPOINTING resolved, and why. `auto` turns it off (the faster update) only where the
    estimated peak without it fits in MEMORY_SHARE of the device's memory, so it never picks a setting that
    does not fit; TRL's own default is on everywhere."""
    if choice != "auto":
        return choice == "on", "as set"
    peak = update_peak_bytes(model_id, tokens_per_pass)
    fits = peak <= MEMORY_SHARE * memory_bytes
    return not fits, (
        f"auto: estimated peak without it {peak / 2**30:.3g} GiB "
        f"{'fits' if fits else 'does not fit'} in {MEMORY_SHARE:.0%} of {memory_bytes / 2**30:.0f} GiB"
    )
