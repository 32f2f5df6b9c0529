"""Sampling from the policy being trained at compiled speed without vLLM; the gradient-checkpointing rule.

TRL's GRPOTrainer samples from the PEFT model as it trains it: a dynamic KV cache and no torch.compile (its
GenerationConfig sets `disable_compile`). On an H100 that is 114 ms per decoding step of 24 sequences; with
a static cache and a compiled step it is 12.7 ms with the LoRA unmerged (the probe in issue 11).
`CompiledSampler` samples that way:

- the LoRA stays unmerged: the sampler runs the very modules the trainer's forward runs, in eval mode (no
  dropout), so it samples the policy being trained. Folding each delta into its bf16 weight was faster in
  the probe (8.7 ms) but not exact where it matters: a delta under half a bf16 step of its weight rounds
  away, and at GRPO's learning rates the deltas of the first steps are that small. Measured on the CPU
  (bench/sampler_exactness.py, BENCHMARKS.md: Qwen2.5-Coder-1.5B's widths, bf16 weights, LoRA r 32 where 20
  Adam steps at lr 5e-6 take it), the fold lost 63% of the LoRA's effect on the log-probabilities, the
  unmerged LoRA none, while TRL treats the samples as on-policy. TRL's importance-sampling correction
  would repair the lag only where its vLLM path runs, so not here. No weight is written, so none needs
  restoring, and no copy of the weights is held;
- the model is put in one state for every call, whoever makes it (TRL's round, the held-out evaluation):
  eval mode, gradient checkpointing off and the embeddings' hooks set aside, because dynamo guards on each
  and a second state is a second compile;
- the KV cache is static and of one length for every call (prompt budget + completion budget), and a call
  with fewer rows than a training round is padded to a round. transformers compiles only the decoding step
  (the prefill runs eagerly), whose shapes are the batch size and the cache length, so prompts of any
  length share one graph: a run compiles once. Attending over the unused cache positions costs little: at
  the seed's shapes the cache is a fifth of the bytes a decoding step reads. The cache is kept from call to
  call (0.8 GiB at the seed's shapes): at the same addresses, the CUDA graph recorded in the first call is
  replayed in every later one;
- the host does as little as it can between decoding steps, which on a GPU cost less than dynamo's checks
  of them (issue 23's profile): dynamo's guards on the modules are skipped and the sampler checks the same
  facts once a call instead (`module_state`; another state empties dynamo's cache and compiles again, with a
  WARNING naming the change). Where the base weights are bf16 the LoRA is multiplied from bf16 copies,
  refreshed in place from the trained float32 weights every call; SDPA reads the shared key/value heads of
  grouped-query attention in place instead of transformers copying them out per layer; and the generate
  loop reads from the device whether every sequence has ended every few steps, not after each;
- it cannot sink a run: with GRPO_GENERATION=auto, a call whose compile fails (no triton, no C compiler, an
  old GPU, an inductor error) logs one line and that call and every later one sample with TRL's plain
  path; with `compiled` asked for explicitly the run stops with one line naming GRPO_GENERATION=plain.
  The first compile is announced before it starts, a later one is a WARNING, and so is a round whose time
  per decoding step doubles against the first rounds after the compile (CUDA graphs re-recorded, say).

train.py installs the sampler as the PEFT model's `generate`, the one call through which TRL samples without
vLLM; the held-out evaluation (evaluate.sample_completions) calls the same `model.generate`, so it samples
through the sampler too, in batches of a training round.
"""

from __future__ import annotations

import copy
import functools
import math
import os
import statistics
import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager

import torch
from peft import PeftModel
from torch._dynamo.utils import counters  # dynamo's own tally of compiled graphs; no public equivalent
from transformers import (
    AutoModelForCausalLM,
    CompileConfig,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    PretrainedConfig,
    PreTrainedModel,
    StaticCache,
)
from transformers.generation import utils as generate_loop  # its StopCheck: no public way to pass one

from envflags import ConfigError
from grouped_lora import grouped_lora
from models import load_config
from packed_weights import packed_linears
from shared_prompts import shared_prompt_cache

# transformers' compile backend on CUDA is inductor. On the CPU transformers does not compile at all; the
# sampler makes it run dynamo with the eager backend there, so the graph capture, its guards and its
# recompilations are exercised without inductor's C++ build (35 s for even the 2-layer test model). Tests
# make a compile fail on any device by giving compile_config a backend that raises.
CPU_BACKEND = "eager"
GQA_SWITCH = "TRANSFORMERS_SDPA_FORCE_GQA"  # transformers' switch to SDPA's own grouped-query attention
END_CHECK_STEPS = 8  # decoding steps between the generate loop's looks at whether every sequence has ended
SLOWDOWN = 2.0  # a round this many times slower per decoding step than the first rounds is a WARNING
BASELINE_ROUNDS = 3  # the rounds after the compiling one whose median is the baseline


@contextmanager
def sampling_state(model: PreTrainedModel | PeftModel) -> Iterator[PreTrainedModel]:
    """The model to call `generate` on, in the one state every sampling call gets: eval mode (no dropout,
    LoRA's included), gradient checkpointing off, the input embeddings without their forward hooks. A PEFT
    model's LoRA stays active and unmerged. Everything is put back on exit."""
    training = model.training
    # Checkpointing does nothing in eval mode, but dynamo guards on the layers' flag, and even on whether
    # the flag is an attribute of the layer or of its class: TRL turns it off around its own generate and an
    # evaluation would not, which made the evaluation compile a second graph. Every call sees the attribute
    # set, to False.
    flags = [
        (m, m.__dict__.get("gradient_checkpointing"))
        for m in model.modules()
        if hasattr(m, "gradient_checkpointing")
    ]
    policy = model.get_base_model() if isinstance(model, PeftModel) else model
    model.eval()
    for module, _ in flags:
        module.gradient_checkpointing = False
    try:
        with hooks_set_aside(policy.get_input_embeddings()):
            yield policy
    finally:
        for module, value in flags:
            if value is None:
                del module.gradient_checkpointing  # the class's default again
            else:
                module.gradient_checkpointing = value
        model.train(training)


def compile_config(device: torch.device) -> CompileConfig:
    """How transformers compiles the decoding step on `device`. Dynamo's guards on the model's modules are
    left out: checked before every decoding step, they cost more host time than the step's GPU work (about
    5 ms of 17.6 on an H100 with the LoRA unmerged, issue 23). The sampler checks what they checked once a
    call instead (`module_state`). CUDA graphs are asked for as an option, the same one transformers'
    default mode sets, because torch.compile takes a mode or options, not both."""
    options = {"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}
    if device.type == "cpu":
        config = CompileConfig(backend=CPU_BACKEND, mode=None, options=options)
        config._compile_all_devices = True  # transformers' switch for compiling on CPU
        return config
    return CompileConfig(backend="inductor", mode=None, options={**options, "triton.cudagraphs": True})


@contextmanager
def lora_in_base_dtype(
    policy: PreTrainedModel, copies: dict[torch.nn.Parameter, torch.Tensor]
) -> Iterator[None]:
    """The LoRA weights in their base layer's dtype (bf16 on a GPU) for the duration: PEFT keeps them in
    float32, which makes every LoRA matmul of a decoding step a small float32 GEMM (196 a step, 2.2 ms of an
    H100's time, issue 23). The trainer's forward, under bf16 autocast, multiplies them in bf16 too. The
    copies live in `copies` from call to call and are refreshed in place from the trained weights each
    call, so their addresses stay those the CUDA graph recorded; they stand in as the parameters' data
    and the float32 data is put back on exit."""
    swapped: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
    for module in policy.modules():
        base = getattr(module, "base_layer", None)
        if base is None or not isinstance(getattr(module, "lora_A", None), torch.nn.ModuleDict):
            continue
        dtype = base.weight.dtype
        for layer in (*module.lora_A.values(), *module.lora_B.values()):
            weight = layer.weight
            if weight.dtype == dtype or not dtype.is_floating_point:  # quantized bases keep theirs
                continue
            if weight not in copies:
                copies[weight] = torch.empty_like(weight, dtype=dtype)
            copies[weight].copy_(weight.detach())
            swapped.append((weight, weight.data))
            weight.data = copies[weight]
    try:
        yield
    finally:
        for weight, data in swapped:
            weight.data = data


@contextmanager
def grouped_query_attention() -> Iterator[None]:
    """SDPA's own grouped-query attention for the duration. With an attention mask (always, for left-padded
    prompts) transformers expands the key/value heads to the query heads' number by copying them in every
    layer (about 2 ms a decoding step of an H100's time, issue 23); SDPA reads the shared heads in place.
    The same arithmetic, so the same log-probabilities."""
    before = os.environ.get(GQA_SWITCH)
    os.environ[GQA_SWITCH] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[GQA_SWITCH]
        else:
            os.environ[GQA_SWITCH] = before


class EndCheckedEvery(generate_loop.StopCheck):
    """The generate loop's stop decision, made every `steps` decoding steps instead of after each one, and at
    `max_length`, where the static cache ends."""

    def __init__(self, steps: int, max_length: int, streamer=None) -> None:
        super().__init__(streamer)
        self.steps, self.max_length, self.taken = steps, max_length, 0

    def __call__(self, unfinished_sequences: torch.Tensor, tokens: torch.Tensor, length: int) -> bool:
        self.taken += 1
        if length >= self.max_length:
            return True
        if self.streamer is not None or self.taken % self.steps == 0:  # a streamer reads every step anyway
            return super().__call__(unfinished_sequences, tokens, length)
        return False


@contextmanager
def ends_checked_every(steps: int, max_length: int) -> Iterator[None]:
    """transformers' generate loop looking every `steps` decoding steps, not after each, at whether every
    sequence has ended. Each look reads a flag from the GPU, so the host waits there for the step to finish
    before it prepares and queues the next one, and the GPU waits for the host in turn (issue 23's profile:
    the GPU idle about half the time). Between looks the host runs ahead of the GPU. A call whose sequences
    all end between two looks runs up to steps - 1 more steps, which add padding after every sequence's end
    token; TRL and the held-out evaluation read a completion up to its end token."""
    original = generate_loop.StopCheck
    generate_loop.StopCheck = functools.partial(EndCheckedEvery, steps, max_length)
    try:
        yield
    finally:
        generate_loop.StopCheck = original


# What dynamo's skipped module guards checked, per module: class, flags and other plain attributes,
# children, hooks, and for parameters and buffers their identity, dtype, shape and address (not their
# values: the compiled step reads those on every call, which is what keeps the sampled policy the trained
# one).
ModuleState = dict[str, Hashable]
PLAIN_VALUES = (bool, int, float, str, type(None), torch.dtype, torch.device)


def module_state(model: torch.nn.Module) -> ModuleState:
    """Each module's state as the compiled step depends on it, by module name; the config's under
    "<config>". Objects other than tensors and plain values count by kind only (module_key), so what
    transformers attaches to the model when it compiles (its compiled call) leaves the state as it was."""
    state: ModuleState = {"<config>": value_key(vars(model.config))}
    state.update((name, module_key(module)) for name, module in model.named_modules())
    return state


def module_key(module: torch.nn.Module) -> Hashable:
    cls = type(module)
    items = []
    for name, value in vars(module).items():
        if name in ("_parameters", "_buffers"):
            items.append((name, tuple((key, tensor_key(tensor)) for key, tensor in value.items())))
        elif name == "_modules":
            items.append((name, tuple((key, id(child)) for key, child in value.items())))
        elif isinstance(value, PLAIN_VALUES):
            # A value equal to the class's own is the same state whether set or not: PEFT's
            # disable_adapter() leaves `_disable_adapters = False` on each layer after the first use.
            if getattr(cls, name, object()) != value:
                items.append((name, value))
        elif isinstance(value, torch.Tensor | list | tuple | dict | set | frozenset):
            items.append((name, value_key(value)))
        # Any other object (the config, read through module_state's own entry; a hook's removal handle;
        # the checkpointing function, unused in eval mode) is not part of what the forward computes.
    return (cls, tuple(items))


def tensor_key(tensor: torch.Tensor | None) -> Hashable:
    if tensor is None:
        return None
    return (id(tensor), tensor.dtype, tuple(tensor.shape), tensor.device, tensor.data_ptr())


def value_key(value: object) -> Hashable:
    if isinstance(value, PLAIN_VALUES):
        return value
    if isinstance(value, torch.Tensor):
        return tensor_key(value)
    if isinstance(value, list | tuple):
        return (type(value), tuple(value_key(item) for item in value))
    if isinstance(value, dict):  # hooks included, by their ids
        return (dict, tuple((key, value_key(item)) for key, item in value.items()))
    if isinstance(value, set | frozenset):
        return (set, frozenset(value_key(item) for item in value))
    return type(value)  # any other object (a hook function, a removal handle): only its kind


def state_change(old: ModuleState, new: ModuleState) -> str:
    """The first module whose state differs, and which of its attributes, for the recompile's WARNING."""
    for name in [*new, *(name for name in old if name not in new)]:
        if old.get(name) == new.get(name):
            continue
        label = name or "the model"
        if name not in old or name not in new:
            return f"{label} {'added' if name not in old else 'removed'}"
        before, after = dict(old[name][1]), dict(new[name][1])  # type: ignore[index]
        changed = sorted(key for key in before.keys() | after.keys() if before.get(key) != after.get(key))
        return f"{label}: {', '.join(changed) or 'its class'}"
    return "nothing"


# The module state the graphs in dynamo's cache were compiled for, whichever sampler compiled them: a graph
# compiled without module guards matches any model's call, so another state must clear the cache.
_compiled_for: ModuleState | None = None


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


def one_line_reason(err: BaseException) -> str:
    """The root cause of a failure, on one line: dynamo wraps a backend's error in its own
    (`backend='inductor' raised:` and a traceback), which says nothing by itself."""
    while err.__cause__ is not None:
        err = err.__cause__
    inner = getattr(err, "inner_exception", None)  # dynamo's BackendCompilerFailed keeps the backend's error
    if isinstance(inner, BaseException):
        err = inner
    first = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
    text = f"{type(err).__name__}: {first}" if first else type(err).__name__
    return text if len(text) <= 200 else text[:197] + "..."


class Sampler:
    """What the two samplers share: they are installed as the policy's `generate`, and they score given
    completions through their own `generate`, so that a test can measure what they sample."""

    batch_size: int | None = None  # calls with fewer rows are padded to this many (CompiledSampler's round)

    def install(self, model: PeftModel) -> None:
        """Make this sampler `model.generate`. TRL's GRPOTrainer samples (without vLLM) by calling `generate`
        on the model `unwrap_model_for_generation` hands it, which is this object (accelerate and DDP wrap
        it, they do not replace it), so an attribute on it is the narrowest hook: no TRL code replaced or
        copied. Settings under which the compiled graph would be wrong (frozen or sharded weights) never get
        here: settings.compiled_refusal turns them to plain sampling before the model loads."""
        model.generate = functools.partial(self.generate, model)

    def token_logprobs(
        self,
        model: PreTrainedModel | PeftModel,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        completion_ids: torch.Tensor,
        generation_config: GenerationConfig,
    ) -> torch.Tensor:
        """Log-probabilities (batch, completion length) that this sampler's distribution gives
        `completion_ids` after the prompts (forced_logprobs), through the same path as its sampling (for
        CompiledSampler the same weights, cache and compiled step). Measures that the sampler samples the
        policy trained. The completions are padded to `batch_size` rows, as `generate` pads the prompts."""
        rows = completion_ids.shape[0]
        if self.batch_size is not None and rows < self.batch_size:
            completion_ids = padded_rows(completion_ids, self.batch_size)
        generate = functools.partial(self.generate, model)
        return forced_logprobs(generate, input_ids, attention_mask, completion_ids, generation_config)[:rows]


class CompiledSampler(Sampler):
    """`generate` through the policy with a static KV cache and transformers' compiled decoding step.

    `batch_size` is a training round's rows on this process: calls with fewer rows (a small held-out set)
    are padded to it, so they share the round's graph. `asked` is what GRPO_GENERATION said: `auto` falls
    back to plain sampling when a compile fails, `compiled` stops the run. `log` receives notes (the compile,
    a fallback), `warn` the WARNING lines."""

    def __init__(
        self,
        max_prompt_length: int,
        batch_size: int | None = None,
        *,
        asked: str = "compiled",
        log: Callable[[str], None] = print,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        if asked not in ("auto", "compiled"):
            raise ValueError(f"asked: expected auto or compiled, got {asked!r}")
        self.max_prompt_length, self.batch_size, self.asked = max_prompt_length, batch_size, asked
        self.log = log
        self.warn = warn or log
        self.caches: dict[tuple[int, int], StaticCache] = {}  # by (batch size, cache length)
        self.compiles = 0  # calls that compiled
        self.calls = 0
        self.failed: str | None = None  # the reason, once a compile failed and auto fell back to plain
        self.step_ms: list[float] = []  # ms per decoding step of each call since the last compile
        self.slow_warned = False
        self.cudagraph_skips = 0
        self.lora_copies: dict[torch.nn.Parameter, torch.Tensor] = {}  # the LoRA in the base's dtype
        self.compiled_state: ModuleState | None = None  # the module state of this sampler's last compile
        self.recompile_reason = ""

    def generation_config(self, config: GenerationConfig, device: torch.device) -> GenerationConfig:
        """`config` with compilation allowed, for the sampler's own static cache."""
        if config.max_new_tokens is None:
            raise ValueError("CompiledSampler needs a GenerationConfig with max_new_tokens")
        config = copy.deepcopy(config)
        config.cache_implementation = None  # the cache is passed in
        config.disable_compile = False  # TRL sets it; transformers compiles the step with a static cache
        config.compile_config = compile_config(device)
        return config

    def generate(
        self,
        model: PreTrainedModel | PeftModel,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        generation_config: GenerationConfig,
        **kwargs,
    ):
        """`model.generate` (left-padded prompts, same output layout: prompt then completion) through the
        compiled step, or TRL's plain path once a compile has failed under `auto`; `kwargs` go to
        transformers' generate."""
        if self.failed is None:
            try:
                return self.compiled_generate(model, input_ids, attention_mask, generation_config, **kwargs)
            except Exception as err:  # whatever torch.compile's stack raises on this box
                reason = one_line_reason(err)
                if self.asked == "compiled":
                    raise ConfigError(
                        f"GRPO_GENERATION=compiled: the compiled sampler failed ({reason}); set "
                        "GRPO_GENERATION=plain to sample without it"
                    ) from err
                self.failed = reason
                self.caches.clear()  # its memory back: plain sampling has its own cache
                self.log(f"sampling: compiled sampler failed ({reason}); sampling with plain from here")
        return plain_generate(model, input_ids, attention_mask, generation_config, **kwargs)

    def compiled_generate(
        self,
        model: PreTrainedModel | PeftModel,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        generation_config: GenerationConfig,
        **kwargs,
    ):
        config = self.generation_config(generation_config, input_ids.device)
        rows = input_ids.shape[0]
        if self.batch_size is not None and rows < self.batch_size:
            input_ids, attention_mask = (
                padded_rows(input_ids, self.batch_size),
                padded_rows(attention_mask, self.batch_size),
            )
        shape = (input_ids.shape[0], max(self.max_prompt_length, input_ids.shape[1]) + config.max_new_tokens)
        if self.calls == 0:
            self.log("compiling the sampler (once per run)...")
        self.calls += 1
        started = time.perf_counter()
        with (
            sampling_state(model) as policy,
            lora_in_base_dtype(policy, self.lora_copies),
            grouped_query_attention(),
            ends_checked_every(END_CHECK_STEPS, input_ids.shape[1] + config.max_new_tokens),
            torch.no_grad(),
        ):
            state = module_state(policy)
            self.clear_graphs_of_another_state(state)
            graphs = counters["stats"]["unique_graphs"]
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
        if input_ids.device.type == "cuda":
            torch.cuda.synchronize(input_ids.device)
        seconds = time.perf_counter() - started
        new_graphs = counters["stats"]["unique_graphs"] - graphs
        if new_graphs:
            global _compiled_for
            _compiled_for = self.compiled_state = state
            self.note_compile(new_graphs, shape, seconds)
        else:
            self.note_round(seconds, output.shape[1] - input_ids.shape[1])
        return output[:rows]

    def clear_graphs_of_another_state(self, state: ModuleState) -> None:
        """Empty dynamo's cache when its graphs were compiled for another module state than `state`, so the
        step compiles again instead of running a graph whose skipped guards would have failed: the model
        switched (another sampler, adapters disabled or swapped), or a weight changed dtype, shape or
        address. The sampler's own state (eval mode, checkpointing off, the LoRA copies) is the same in
        every call, so a run whose model stays itself compiles once."""
        if _compiled_for is None or state == _compiled_for:
            return
        if self.compiled_state == state:
            self.recompile_reason = "another model was compiled since this sampler's last compile"
        elif self.compiled_state is not None:
            changed = state_change(self.compiled_state, state)
            self.recompile_reason = f"the model's state changed since the last compile: {changed}"
        torch.compiler.reset()

    def note_compile(self, graphs: int, shape: tuple[int, int], seconds: float) -> None:
        """The first compile is a note; any later one a WARNING, since a run needs one (after 8, dynamo
        silently falls back to eager for the rest of the run)."""
        self.compiles += 1
        self.step_ms, self.slow_warned = [], False  # the new graph's rounds are the new baseline
        skips = counters["inductor"]["cudagraph_skips"]
        what = (
            f"{graphs} graph(s) for {shape[0]} sequences x {shape[1]} cache positions; this call took "
            f"{seconds:.1f} s; CUDA graphs skipped: {skips}"
        )
        if self.compiles == 1:
            self.log(f"sampling compiled: {what}")
        else:
            why = self.recompile_reason or "TORCH_LOGS=recompiles says why"
            self.warn(f"WARNING sampling recompiled ({self.compiles} compiles this run; {why}): {what}")
        self.recompile_reason = ""
        self.cudagraph_skips = skips

    def note_round(self, seconds: float, steps: int) -> None:
        """WARNING once when a round's time per decoding step reaches SLOWDOWN times the median of the first
        rounds after the compile, or when inductor skipped CUDA graphs since: a silent slowdown otherwise."""
        skips = counters["inductor"]["cudagraph_skips"]
        if skips > self.cudagraph_skips:
            more = skips - self.cudagraph_skips
            self.warn(f"WARNING sampling: inductor skipped CUDA graphs {more} more time(s) since the compile")
            self.cudagraph_skips = skips
        if steps <= 0:
            return
        self.step_ms.append(1000 * seconds / steps)
        if len(self.step_ms) <= BASELINE_ROUNDS or self.slow_warned:
            return
        baseline = statistics.median(self.step_ms[:BASELINE_ROUNDS])
        if self.step_ms[-1] >= SLOWDOWN * baseline:
            self.slow_warned = True
            last = self.step_ms[-1]
            self.warn(
                f"WARNING sampling: {last:.1f} ms per decoding step, {last / baseline:.1f}x "
                f"the {baseline:.1f} ms of the first rounds after the compile (CUDA graphs re-recorded? "
                "TORCH_LOGS=cudagraphs says)"
            )


class PlainSampler(Sampler):
    """TRL's plain sampling (`generate` on the PEFT model, dynamic cache, no compile) in the sampler's model
    state (sampling_state: eval mode, so no LoRA dropout) and, where the base weights are bf16, with the LoRA
    multiplied from bf16 copies refreshed every call (lora_in_base_dtype): what the trainer's forward
    computes under bf16 autocast. train.py installs it on the CPU when the update runs under bf16 autocast
    there (cpu_training.bf16_autocast), so that sampling and the update compute one policy; float32 LoRA
    GEMMs and casts in every decoding step are what it saves. Rows that share a prompt (a group) have it
    run through the model once (shared_prompt_cache). On the CPU the LoRA layers that read one input run as
    one product (grouped_lora): 11 products a decoder layer where the lean forward makes 21; their weights
    and the LM head are multiplied from copies in oneDNN's layout, made once a call or evaluation
    (packed_weights)."""

    def __init__(self) -> None:
        self.lora_copies: dict[torch.nn.Parameter, torch.Tensor] = {}
        self.lora_groups: dict[tuple[torch.nn.Module, ...], torch.Tensor] = {}

    def generate(
        self,
        model: PreTrainedModel | PeftModel,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        generation_config: GenerationConfig,
        **kwargs,
    ):
        with (
            lora_in_base_dtype(model, self.lora_copies),
            grouped_lora(model, self.lora_groups),
            packed_linears(model),
        ):
            if kwargs.get("past_key_values") is None:  # a caller's own cache (a later chunk) is kept
                with sampling_state(model) as policy, torch.no_grad():
                    cache = shared_prompt_cache(policy, input_ids, attention_mask)
                if cache is not None:
                    kwargs["past_key_values"] = cache
            return plain_generate(model, input_ids, attention_mask, generation_config, **kwargs)


def forced_logprobs(
    generate: Callable[..., torch.Tensor],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    generation_config: GenerationConfig,
) -> torch.Tensor:
    """Log-probabilities (batch, completion length) that `generate`'s distribution gives `completion_ids`
    after the prompts: the completions are forced token by token through `generate` and each step's logits
    divided by the temperature, as TRL's trainer scores them."""
    config = copy.deepcopy(generation_config)
    config.max_new_tokens = completion_ids.shape[1]
    config.eos_token_id = None  # an end token inside the forced completion must not stop it
    forced = _ForcedTokens(completion_ids, input_ids.shape[1], config.temperature)
    generate(input_ids, attention_mask, config, logits_processor=LogitsProcessorList([forced]))
    return torch.cat(forced.logprobs, dim=1)


def padded_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """`tensor` with its last row repeated up to `rows` rows (the extra rows' outputs are dropped)."""
    return torch.cat([tensor, tensor[-1:].expand(rows - tensor.shape[0], *tensor.shape[1:])])


def plain_generate(
    model: PreTrainedModel | PeftModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    generation_config: GenerationConfig,
    **kwargs,
):
    """The model class's own `generate` (the one the sampler was installed over) with compilation off:
    TRL's plain sampling, in the sampler's model state."""
    config = copy.deepcopy(generation_config)
    config.disable_compile = True
    with sampling_state(model), torch.no_grad():
        return type(model).generate(
            model, input_ids=input_ids, attention_mask=attention_mask, generation_config=config, **kwargs
        )


class _ForcedTokens(LogitsProcessor):
    """Records the log-probability of the given token at each step, then leaves only that token possible,
    so that sampling follows a fixed completion. transformers runs the processors given to `generate`
    before its temperature and top-k/top-p warpers: the scores seen here are the model's logits."""

    def __init__(self, tokens: torch.Tensor, prompt_length: int, temperature: float) -> None:
        self.tokens, self.prompt_length, self.temperature = tokens, prompt_length, temperature
        self.logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        # The rows of this call: a round's padded rows, or the caller's own after a fallback to plain.
        token = self.tokens[: scores.shape[0], input_ids.shape[1] - self.prompt_length].unsqueeze(1)
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
# shapes); with the LoRA unmerged it holds no copy of the weights.
WEIGHT_COPIES = 3
MEMORY_SHARE = 0.8  # the rest for the allocator's fragmentation, the CUDA context and compiled graphs


def model_size(config: PretrainedConfig) -> tuple[int, int]:
    """(parameters, bytes) of the weights of the model `config` describes, counted on the meta device:
    nothing is loaded."""
    with torch.device("meta"):
        parameters = list(AutoModelForCausalLM.from_config(config, dtype=config.dtype).parameters())
    return sum(p.numel() for p in parameters), sum(p.numel() * p.element_size() for p in parameters)


def update_peak_bytes(config: PretrainedConfig, weight_bytes: int, tokens_per_pass: int) -> int:
    """Estimated peak memory of a GRPO run without gradient checkpointing, from the model's config and the
    size of its weights (model_size); tokens_per_pass is the update's batch times the longest sequence
    (prompt + completion budgets)."""
    text = config.get_text_config()
    width = text.hidden_size + text.intermediate_size
    return WEIGHT_COPIES * weight_bytes + ACTIVATION_BYTES * text.num_hidden_layers * width * tokens_per_pass


def model_update_peak_bytes(model_id: str, tokens_per_pass: int) -> int:
    """update_peak_bytes of the model `model_id`, its config read (from the hub, a local folder or a GGUF
    file)."""
    config = load_config(model_id)
    return update_peak_bytes(config, model_size(config)[1], tokens_per_pass)


def device_memory(device: torch.device) -> int:
    """Bytes of the device the run trains on: the GPU's, or the machine's RAM for the CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def gradient_checkpointing(choice: str, peak_bytes: Callable[[], int], memory_bytes: int) -> tuple[bool, str]:
    """GRPO_GRADIENT_CHECKPOINTING resolved, and why. `auto` turns it off (the faster update) only where the
    estimated peak without it (`peak_bytes()`, asked only then) fits in MEMORY_SHARE of the device's memory,
    so it never picks a setting that does not fit; TRL's own default is on everywhere."""
    if choice != "auto":
        return choice == "on", "as set"
    peak = peak_bytes()
    fits = peak <= MEMORY_SHARE * memory_bytes
    return not fits, (
        f"auto: estimated peak without it {peak / 2**30:.3g} GiB "
        f"{'fits' if fits else 'does not fit'} in {MEMORY_SHARE:.0%} of {memory_bytes / 2**30:.0f} GiB"
    )
