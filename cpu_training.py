"""What makes a GRPO or SFT step of a bf16 model fast on the CPU, where users without a GPU (and every
measurement of the real model on the project's 2-core box) train; nothing here changes a run on a GPU.

Measured together on the real Qwen2.5-Coder-0.5B by bench/cpu_step.py (BENCHMARKS.md), against TRL's and
transformers' own CPU path:

- bf16 autocast in the update (`bf16_autocast`). train.py loads the weights in bf16, but on the CPU TRL ran
  without autocast, so PEFT multiplied every LoRA in float32 (its adapters are float32): two small float32
  GEMMs per LoRA (336 a forward of the 0.5B) and casts of the activations to float32 and back, at about a
  quarter of the bf16 matrix rate. Under autocast the
  LoRA is multiplied in bf16 from its float32 weights, as on a GPU; the optimizer still holds float32.
  Sampling multiplies it the same way (generation.PlainSampler), so both compute one policy. PEFT's cast
  of each LoRA's input to float32 (which autocast casts back) is switched off (`fast_kernels`).
- The LM head only where a log-probability is needed (`completion_scoring`). TRL's fused LM head scores
  every position of a sequence on devices without Triton, so that Neuron's compiler sees one shape; on the
  CPU that is the prompt's 400-odd positions for every 256 completion ones, each a 151,936-wide row of the
  head in the forward, again in the backward, and a float32 GEMM of the gradient. The CPU takes the compact
  path TRL takes on CUDA: the same per-token values at the completion positions.
- Threads for the cores others leave free (`use_free_cores`): torch starts one per core whatever else
  runs, and on a shared machine two threads on two busy cores are several times slower than one.
- Plain attention heads for SDPA (`plain_gqa`). transformers asks SDPA for its grouped-query kernel
  (`enable_gqa=True`) whenever the attention mask is None (sequences of one length: a group's completions
  that all ran to the limit, one prompt's samples), and torch's CPU kernel for it is several times slower
  per call than the plain one on copied key/value heads (issue 33). On the CPU the copy is made, as with a
  mask; the same arithmetic.
- Query heads packed onto their key/value head (`packed_gqa`). Where there is a mask, transformers copies
  every key and value head once for each of its query heads (`repeat_kv`; Qwen2.5-0.5B: 7 query heads to
  each of 2) for SDPA, as it does for several queries on any device. SDPA's CPU backward on the copies
  was most of the update's attention time (17% of a group's forward and backward in torch.profiler); with
  a key/value head's query heads packed into its query positions instead (transformers packs them so for
  one query, when decoding), attention's forward and backward took 1.5x to 2.2x less time at the update's
  shapes, the outputs bit for bit the same.
- A contiguous input for the LM head (`contiguous_head_input`). A prompt's first forward in `generate`
  projects only the last position, `hidden[:, -1:]`, a slice whose rows lie a prompt apart; torch's matmul
  folds a 3-D input into one matrix product only where its rows are evenly packed, and otherwise expands the
  weight to a batch of copies for `bmm`: the 0.5B's 151,936 x 896 head copied once per row, 4.4 GB for 16
  rows, where a contiguous copy of the slice takes one plain matrix product (bit for bit the same logits).
  Every sampling round and every evaluation batch paid it once.
- One random draw per sampled token (`inverse_cdf_draws`). `torch.multinomial` draws one token by drawing an
  exponential for every entry of the vocabulary and taking the largest probability-to-draw ratio: 151,936
  draws a row from torch's CPU generator, one element at a time, at every decoding step. Inverting each
  row's cumulative probabilities at one uniform draw samples the same distribution. The sum runs in blocks
  of 128 entries (each summed in float32, the running sums in float64), then within the block the draw falls
  in, so that no float64 copy of a whole row is made at every decoding step.
- The LoRA in two operations a layer (`lean_lora`). After A, PEFT's forward calls the dropout module (in
  eval mode, for nothing), B, a product by the scaling and a sum, each a Python call and the last two a pass
  over the layer's output: 168 LoRA layers in every decoding step of the 0.5B. On CPU tensors B's product
  is scaled and summed into the base layer's output in one addmm, in sampling and in the update alike.
- A group's prompt run once in the update (`shared_prompt_passes`, shared_prompts.py says how): TRL's
  forward and backward ran each row's prompt, 16 runs of the round's 2 prompts; each pass now runs its
  distinct prompts once and only the columns some row attends to. TRL shuffles a round's rows before
  splitting it into passes; here the passes keep the round's order, so a pass holds one group's rows.
- A pass of a whole group (`update_passes`, `group_per_pass`): where TRL's passes of GRPO_BATCH_SIZE rows
  would each hold part of a group (2 of a group of 8), each of them ran the group's prompt again; a pass
  now holds the group, its prompt run once, its rows in forwards of like completion lengths
  (shared_prompts.length_buckets) so that one long completion does not pad the others.
- The LM head's tiles folded in place and its gradient summed by bf16 arithmetic in float32 (`lean_lm_head`).
  TRL's chunked log-probabilities fold each tile of 32,768 logits with torch operations on devices without
  Triton, several float32 temporaries of the tile each, and sum the head's gradient in a float32 GEMM of
  float32 copies of the tile and of the head's slice, at a quarter of the bf16 rate. The same folds run in
  one float32 copy of the tile, bit for bit TRL's; the gradient's exact products of bf16 values are summed
  in float32 by oneDNN's bf16 mode for float32 matmuls, from float32 copies of the head kept between steps.
- Dropout's masks from 16 random bits an element (`dropout_masks_from_bits`). torch's CPU dropout draws one
  number from its generator for every element it may drop, serially: the LoRA's dropout (the seed's 0.05)
  cost the update about 1.5x at two threads. Four elements now share one 64-bit draw; p is rounded to a
  multiple of 1/65,536.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from envflags import ConfigError
from models import load_config

# Entries of a row summed together before the draw picks a block (inverse_cdf_draw): a block's sum is a
# vectorised reduction, and a decoding step's cumulative sums run over width / 128 blocks and 128 entries.
DRAW_BLOCK = 128


def on_cpu() -> bool:
    """Whether training runs on the CPU: no CUDA device and no Apple GPU."""
    import torch

    return not torch.cuda.is_available() and not torch.backends.mps.is_available()


def threads_for(cores: int, load: float) -> int:
    """torch's threads on a CPU of `cores` cores whose load average (others' runnable processes) is `load`:
    one per core the others leave free, at least one. OpenMP's threads wait for each other at the end of
    every kernel, so a thread that shares its core with another process holds up the rest: on the 2-core
    box at a load of 7.6, one thread sampled 3.9x and updated 3.0x faster than two (issue 33)."""
    return max(1, min(cores, cores - math.ceil(load - 0.5)))


def use_free_cores(note) -> None:
    """torch's threads set by threads_for from its threads now (one per physical core unless the process
    chose fewer, as the demo does) and the 1-minute load average now, with a note saying so;
    OMP_NUM_THREADS, where set, is the user's choice and is left alone."""
    import torch

    if "OMP_NUM_THREADS" in os.environ:
        note(f"CPU threads: {torch.get_num_threads()} (OMP_NUM_THREADS)")
        return
    cores, load = torch.get_num_threads(), os.getloadavg()[0]
    torch.set_num_threads(threads_for(cores, load))
    note(f"CPU threads: {torch.get_num_threads()} of {cores} (load average {load:.1f} when the run started)")


def bf16_autocast(weights_dtype: object) -> bool:
    """Whether training runs under bf16 autocast: on a GPU with bf16 (as before), and on a CPU with bf16
    kernels (AVX-512 BF16 or AMX) for weights stored in bf16 (`weights_dtype`: the config's dtype, a torch
    dtype or its name), where autocast changes only the LoRA's matmuls (from float32 to bf16, as on a GPU).
    A float32 model on the CPU keeps float32 throughout."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    if not on_cpu() or not torch.ops.mkldnn._is_mkldnn_bf16_supported():  # torch's own check; no public one
        return False
    return weights_dtype in (torch.bfloat16, "bfloat16")


def model_bf16_autocast(model_id: str) -> bool:
    """bf16_autocast for the model `model_id`, its config read (no weights loaded). A config that cannot be
    read says no here: loading the tokenizer and the model reports what is wrong with the folder, in the
    order a run meets it."""
    try:
        return bf16_autocast(load_config(model_id).dtype)
    except ConfigError:
        return False


@contextmanager
def replaced(owner: object, name: str, value: object) -> Iterator[None]:
    """`owner.name` is `value` while open, and what it was again on exit."""
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


@contextmanager
def plain_gqa() -> Iterator[None]:
    """transformers' SDPA attention never asks for torch's grouped-query kernel on CPU tensors (the module
    docstring says why); CUDA and other devices keep transformers' choice."""
    from transformers.integrations import sdpa_attention

    original = sdpa_attention.use_gqa_in_sdpa

    def use_gqa_in_sdpa(attention_mask, key, value) -> bool:
        return key.device.type != "cpu" and original(attention_mask, key, value)

    with replaced(sdpa_attention, "use_gqa_in_sdpa", use_gqa_in_sdpa):
        yield


def packed_gqa_attention(original: Callable) -> Callable:
    """transformers' SDPA attention (`original`) for CPU tensors of grouped-query heads with several queries
    and a mask shared by the heads: each key/value head's query heads packed into its query positions, as
    transformers packs them itself for one query (`pack_gqa`), where it copies every key and value head once
    for each of its query heads (`repeat_kv`, the module docstring says why). The same products for every
    query; the keys' and values' gradients summed over their query heads inside SDPA's kernel, where
    `repeat_kv`'s backward summed them after it. Other calls (one query, no mask, a mask per head, dropout, a
    softcap, a position bias, a paged cache) go to `original`."""
    import torch.nn.functional as F

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kw):
        groups = getattr(module, "num_key_value_groups", 1)
        batch, heads, queries, dim = query.shape
        if (
            query.device.type != "cpu"
            or groups == 1
            or queries == 1
            or dropout
            or attention_mask is None
            or attention_mask.dim() != 4
            or attention_mask.shape[1] != 1
            or kw.get("output_attentions")
            or any(kw.get(name) is not None for name in ("softcap", "position_bias", "cache"))
        ):
            return original(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kw)
        packed = query.reshape(batch, heads // groups, groups * queries, dim)
        mask = attention_mask[:, :, None].expand(-1, -1, groups, -1, -1).flatten(2, 3)
        out = F.scaled_dot_product_attention(packed, key, value, attn_mask=mask, scale=scaling)
        return out.view(batch, heads, queries, dim).transpose(1, 2).contiguous(), None

    return attention


@contextmanager
def packed_gqa() -> Iterator[None]:
    """While open, models' SDPA attention is packed_gqa_attention: the CPU's calls with several queries
    and a mask run on the key/value heads; other calls and devices are transformers' own."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    original = ALL_ATTENTION_FUNCTIONS["sdpa"]
    ALL_ATTENTION_FUNCTIONS["sdpa"] = packed_gqa_attention(original)  # a local override, as models look up
    try:
        yield
    finally:
        del ALL_ATTENTION_FUNCTIONS["sdpa"]
        if ALL_ATTENTION_FUNCTIONS["sdpa"] is not original:  # `original` was itself a local override
            ALL_ATTENTION_FUNCTIONS["sdpa"] = original


@contextmanager
def completion_scoring() -> Iterator[None]:
    """TRL's fused LM head scores only the positions with a label (the completion's) on the CPU too, as it
    does where Triton runs (the module docstring says why). TRL reads that choice from one private function
    of trl.trainer.utils; the kernels' own choice of Triton or torch is left alone."""
    from trl.trainer import utils as trl_utils

    original = trl_utils._use_triton

    def compact(device) -> bool:
        return device.type == "cpu" or original(device)

    with replaced(trl_utils, "_use_triton", compact):
        yield


def lm_head_tile_statistics(original: Callable) -> Callable:
    """TRL's `_forward_tile` (one tile of logits folded into each token's running maximum, sum of
    exponentials, entropy sum and target logit, on devices without Triton) with two float32 temporaries of
    the tile's size where TRL's makes five: the same operations in the same order, so the same bits. Calls
    asking for more than the log-probabilities and the entropy, or with a softcap, go to `original`."""
    import torch

    def tile_statistics(
        tile, tile_stride, targets, running_max, sum_exp, x_sum_exp, sq_sum_exp, z_sum, max_before_target,
        target_logit, vocab_start, n_cols, **flags,
    ):  # fmt: skip
        if any(flags[f] for f in ("HAS_SOFTCAP", "HAS_LOG_SUM_SQ_PROBS", "HAS_MEAN_LOGITS", "HAS_IS_TOP1")):
            return original(
                tile, tile_stride, targets, running_max, sum_exp, x_sum_exp, sq_sum_exp, z_sum,
                max_before_target, target_logit, vocab_start, n_cols, **flags,
            )  # fmt: skip
        z = tile.float()
        if flags["logit_scale"] != 1:  # a product by 1 is the value itself
            z.mul_(flags["logit_scale"])
        z.mul_(flags["inv_t"])
        new_max = torch.maximum(running_max, z.amax(-1))
        rescale = torch.exp(running_max - new_max)
        e = torch.sub(z, new_max.unsqueeze(-1)).exp_()
        sum_exp.mul_(rescale).add_(e.sum(-1))
        if flags["HAS_ENTROPY"]:
            x_sum_exp.mul_(rescale).add_(e.mul_(z).sum(-1))
        running_max.copy_(new_max)
        local = targets - vocab_start
        in_tile = (local >= 0) & (local < n_cols)
        target_z = z.gather(-1, local.clamp(0, n_cols - 1).unsqueeze(-1)).squeeze(-1)
        target_logit.copy_(torch.where(in_tile, target_z, target_logit))
        return None

    return tile_statistics


def lm_head_tile_gradient(original: Callable) -> Callable:
    """TRL's `_backward_tile` (the LM head's gradient for one tile of logits, on devices without Triton) in
    place in one float32 copy of the tile: the same operations in the same order, so the same bits, in 6
    passes over the tile where TRL's makes about 14 and 9 temporaries of its size. Calls it does not take
    (a softcap, an entropy gradient, no log-probability gradient) go to `original`."""

    def tile_gradient(
        tile, tile_stride, targets, log_z, entropy, grad_logprobs, grad_entropy, vocab_start, n_cols, **flags
    ):
        if flags["HAS_SOFTCAP"] or flags["HAS_ENTROPY_GRAD"] or not flags["HAS_LOGPROB_GRAD"]:
            return original(
                tile, tile_stride, targets, log_z, entropy, grad_logprobs, grad_entropy, vocab_start, n_cols,
                **flags,
            )  # fmt: skip
        logit_scale, inv_t = flags["logit_scale"], flags["inv_t"]
        p = tile.float()
        if logit_scale != 1:  # a product by 1 is the value itself
            p.mul_(logit_scale)
        p.mul_(inv_t).sub_(log_z.unsqueeze(-1)).exp_()
        local = targets - vocab_start
        rows = ((local >= 0) & (local < n_cols)).nonzero().squeeze(1)
        columns = local[rows]
        at_target = p[rows, columns]
        grad = grad_logprobs.unsqueeze(-1)
        p.mul_(grad.neg())  # TRL's grad * (0 - p) off the target
        p[rows, columns] = grad[rows, 0] * (1 - at_target)
        p.mul_(inv_t)
        if logit_scale != 1:
            p.mul_(logit_scale)
        tile.copy_(p)
        return None

    return tile_gradient


def lm_head_gradient_product(original: Callable) -> Callable:
    """TRL's `_addmm_fp32` (`acc += a @ b` summed in float32, for bf16 `a` and `b`) on the CPU: products of
    the bf16 values summed in float32 by oneDNN's bf16 arithmetic for float32 matmuls, where TRL casts both
    to float32 for a float32 GEMM (several times slower on a CPU with bf16 kernels); the float32 copy of `b`
    where it is a slice of a kept weight (the LM head's, the same slices at every step) is kept from call to
    call while that weight is unchanged. The sums differ from the float32 GEMM's only in their order. Other
    calls go to `original`."""
    import torch

    copies: dict[tuple, tuple[int, torch.Tensor]] = {}  # a slice's place -> its weight's version, its copy
    matmul = torch.backends.mkldnn.matmul

    def product(acc, a, b) -> None:
        if acc.device.type != "cpu" or a.dtype != torch.bfloat16 or b.dtype != torch.bfloat16:
            return original(acc, a, b)
        if b._base is None:  # a cast made for this call, not a slice of the kept weight: nothing to keep
            float_b = b.float()
        else:
            place = (b._base.data_ptr(), b.storage_offset(), tuple(b.shape), b.stride())
            if place not in copies or copies[place][0] != b._version:
                copies[place] = (b._version, b.float())
            float_b = copies[place][1]
        with replaced(matmul, "fp32_precision", "bf16"):
            acc.addmm_(a.float(), float_b)
        return None

    return product


@contextmanager
def lean_lm_head() -> Iterator[None]:
    """TRL's chunked LM head (log-probabilities without the whole logits) folds its tiles and sums its
    gradient on the CPU with lm_head_tile_statistics, lm_head_tile_gradient and lm_head_gradient_product;
    on a GPU its Triton kernels are untouched."""
    from trl.kernels import chunked_logprob as head

    with (
        replaced(head, "_forward_tile", lm_head_tile_statistics(head._forward_tile)),
        replaced(head, "_backward_tile", lm_head_tile_gradient(head._backward_tile)),
        replaced(head, "_addmm_fp32", lm_head_gradient_product(head._addmm_fp32)),
    ):
        yield


@contextmanager
def contiguous_head_input(model) -> Iterator[None]:
    """While open, the model's LM head gets its input as a contiguous tensor (the module docstring says why):
    a copy of the last position's hidden states per row, nothing where the input is contiguous already."""

    def contiguous(module, args):
        return (args[0].contiguous(), *args[1:])

    hook = model.get_output_embeddings().register_forward_pre_hook(contiguous)
    try:
        yield
    finally:
        hook.remove()


def lean_lora_forward(original: Callable) -> Callable:
    """PEFT's LoRA Linear forward (`original`) for one plain adapter on CPU tensors in two operations after
    the base layer's: the input times A, then that times B, scaled and added to the base layer's output in
    one addmm. PEFT calls the dropout module (a call for nothing in eval mode), B, a product by the scaling
    and a sum, each a pass over the output or a Python call: 168 LoRA layers a decoding step of the 0.5B.
    The same terms, the scaled product summed into the output before it is rounded to bf16 where PEFT rounds
    the product, its scaling and the sum in turn. Other calls (extra arguments, another device, adapters
    off, merged or mixed, a variant such as DoRA, a bias on B, hooks on A or B) go to `original`."""
    import torch
    import torch.nn.functional as F

    from grouped_lora import lean_adapter

    def forward(self, x, *args, **kwargs):
        name = None if args or kwargs or x.device.type != "cpu" else lean_adapter(self)
        if name is None:
            return original(self, x, *args, **kwargs)
        a, b = self.lora_A[name], self.lora_B[name]
        result = self.base_layer(x)
        x = self._cast_input_dtype(x, a.weight.dtype)
        dropout = self.lora_dropout[name]
        if dropout.training and not isinstance(dropout, torch.nn.Identity):
            x = dropout(x)
        down = F.linear(x, a.weight)
        flat = result.reshape(-1, result.shape[-1])
        if torch.is_autocast_enabled("cpu") or flat.dtype == down.dtype == b.weight.dtype:
            summed = torch.addmm(
                flat, down.reshape(-1, down.shape[-1]), b.weight.t(), alpha=self.scaling[name]
            )
            return summed.view(result.shape)
        return (result + F.linear(down, b.weight) * self.scaling[name]).to(result.dtype)

    return forward


@contextmanager
def lean_lora() -> Iterator[None]:
    """While open, PEFT's LoRA Linear layers run lean_lora_forward on CPU tensors."""
    from peft.tuners.lora import layer

    with replaced(layer.Linear, "forward", lean_lora_forward(layer.Linear.forward)):
        yield


def first_above(cumulative, values):
    """Per row, the first column of `cumulative` (non-decreasing rows) above `values` (one per row), or, where
    rounding put a value at or past the row's last entry, the first column that reaches that entry: never a
    column that adds nothing to the one before it."""
    import torch

    index = torch.searchsorted(cumulative, values, right=True)
    return torch.minimum(index, torch.searchsorted(cumulative, cumulative[:, -1:].contiguous()))


def inverse_cdf_draw(probs, generator=None):
    """One index per row of `probs` (rows of non-negative weights, as `generate` passes to
    `torch.multinomial(probs, 1)`), drawn with probability proportional to its weight: the first entry whose
    cumulative weight exceeds a uniform draw times the row's total, never an entry of weight 0. The sum runs
    in two levels, blocks of DRAW_BLOCK entries and then within the block the draw falls in: one pass over the
    row, where a cumulative sum of the whole row (151,936 entries for Qwen2.5) casts the row to float64. A
    block's sum is taken in float32, so no float64 copy of the row is made; the sums over blocks and within
    a block run in float64. (torch.profiler put the whole row's sum at about 20 ms of a decoding step of 16
    rows and the blocks' float64 copy at about 6; on this project's virtual machine it overstates short
    operations, the softmax of a step 9.6 ms against 1.3 ms by the clock.) None where a row's total is not a
    positive finite number: torch.multinomial's own error says what is wrong with it."""
    import torch

    rows, width = probs.shape
    whole = width - width % DRAW_BLOCK
    block_dtype = torch.promote_types(probs.dtype, torch.float32)  # generate's rows: float32, summed in place
    sums = probs[:, :whole].view(rows, -1, DRAW_BLOCK).sum(-1, dtype=block_dtype)
    if whole < width:
        sums = torch.cat([sums, probs[:, whole:].sum(-1, keepdim=True, dtype=block_dtype)], dim=1)
    cumulative = sums.cumsum(-1, dtype=torch.float64)
    total = cumulative[:, -1:]
    if not bool(((total > 0) & total.isfinite()).all()):
        return None
    draw = torch.rand(total.shape, dtype=torch.float64, device=probs.device, generator=generator) * total
    block = first_above(cumulative, draw)
    before = torch.nn.functional.pad(cumulative, (1, 0)).gather(1, block)  # the weight of the blocks before
    columns = block * DRAW_BLOCK + torch.arange(DRAW_BLOCK, device=probs.device)
    inside = probs.gather(1, columns.clamp(max=width - 1)).masked_fill(columns >= width, 0)
    return block * DRAW_BLOCK + first_above(inside.cumsum(-1, dtype=torch.float64), draw - before)


@contextmanager
def inverse_cdf_draws() -> Iterator[None]:
    """While open, `torch.multinomial(probs, 1)` on a 2-D CPU tensor is inverse_cdf_draw (the module docstring
    says why); every other call (another device, more samples, one row as a vector, an `out` tensor) is
    torch's own."""
    import torch

    original = torch.multinomial

    def multinomial(input, num_samples, replacement=False, *, generator=None, out=None):
        if input.device.type == "cpu" and input.dim() == 2 and num_samples == 1 and out is None:
            drawn = inverse_cdf_draw(input, generator)
            if drawn is not None:
                return drawn
        return original(input, num_samples, replacement, generator=generator, out=out)

    with replaced(torch, "multinomial", multinomial):
        yield


def dropout_from_bits(x, dropped: int):
    """`x` with each element zeroed where a 16-bit random draw falls below `dropped` (out of 65,536) and
    the rest scaled by the inverse of the kept share: dropout at p = dropped / 65,536, its mask drawn four
    elements to one 64-bit draw of torch's CPU generator."""
    import torch

    n = x.numel()
    bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), 2**63 - 1)  # all 64 bits random
    drop = bits.view(torch.int16)[:n].view(x.shape) < dropped - 32768
    # Zeroing the scaled copy in place: the values of torch.where(kept, x, 0) * scale in one pass fewer (a
    # probe: 35 against 50 ms for one pass's 2,000 x 4,864 input of a down projection)
    return (x * (65536 / (65536 - dropped))).masked_fill_(drop, 0)


@contextmanager
def dropout_masks_from_bits() -> Iterator[None]:
    """While open, dropout in training on a CPU tensor (the LoRA's, as nn.Dropout calls
    `torch.nn.functional.dropout`) is dropout_from_bits at p rounded to a multiple of 1/65,536 (0.05 is
    0.050003); every other call (eval mode, p 0 or 1, in place, another device) is torch's own."""
    import torch.nn.functional as F

    original = F.dropout

    def dropout(input, p=0.5, training=True, inplace=False):
        dropped = round(p * 65536)
        if training and not inplace and 0 < dropped < 65536 and input.device.type == "cpu":
            return dropout_from_bits(input, dropped)
        return original(input, p, training, inplace)

    with replaced(F, "dropout", dropout):
        yield


def update_pass_tokens(cfg, whole_groups: bool) -> int:
    """The most positions one pass of the update holds: a whole group's prompt, once, and its completions
    (shared_prompt_passes), or TRL's GRPO_BATCH_SIZE rows of prompt and completion each."""
    if whole_groups:
        return cfg.max_prompt_length + cfg.num_generations * cfg.max_completion_length
    return cfg.per_device_train_batch_size * (cfg.max_prompt_length + cfg.max_completion_length)


def update_passes(
    cfg, processes: int, peak_bytes: Callable[[int], int], memory_bytes: int
) -> tuple[bool, str, bool]:
    """GRPO_GRADIENT_CHECKPOINTING resolved (generation.gradient_checkpointing, from the estimated peak
    `peak_bytes` of a pass's positions), why, and whether each pass of the update holds one whole group.
    It does on the CPU, in one process, where TRL's passes of GRPO_BATCH_SIZE completions would hold part of
    a group (fewer than GRPO_NUM_GENERATIONS) and the group's pass fits without checkpointing (whose layers
    drop the cache a shared prompt needs): shared_prompt_passes then runs each prompt once a round, where
    each of its group's passes ran it again (2 prompts x 8 completions in passes of 2: 8 prompt runs a step,
    now 2). group_per_pass sets it."""
    from generation import gradient_checkpointing

    def resolved(whole_groups: bool) -> tuple[bool, str]:
        tokens = update_pass_tokens(cfg, whole_groups)
        return gradient_checkpointing(cfg.gradient_checkpointing, lambda: peak_bytes(tokens), memory_bytes)

    splits_groups = cfg.per_device_train_batch_size < cfg.num_generations
    if on_cpu() and processes == 1 and splits_groups and cfg.gradient_checkpointing != "on":
        checkpointing, why = resolved(True)
        if not checkpointing:
            return False, why, True
    return (*resolved(False), False)


def group_per_pass(args, num_generations: int) -> None:
    """TRL's GRPOConfig `args` set to train each round in passes of one group (`num_generations` rows), as
    many as the round has prompts: the same round, optimizer step and gradient (shared_prompt_passes says
    when the split matters), each prompt run once (update_passes says where)."""
    round_rows = args.per_device_train_batch_size * args.gradient_accumulation_steps
    args.per_device_train_batch_size = num_generations
    args.gradient_accumulation_steps = args.steps_per_generation = round_rows // num_generations


def in_round_order(batch: dict) -> dict:
    """A round's rows as TRL's round lists them: a group's completions one after another."""
    return batch


@contextmanager
def shared_prompt_passes() -> Iterator[None]:
    """While open, GRPOTrainer scores a pass's completions with each distinct prompt run once
    (shared_prompts.completion_scores, in TRL's chunks of rows and under its autocast), and splits a round
    into passes in the round's order, not shuffled, so that a pass holds rows of one group. The step's
    gradient is the same for any split of the round into passes of equal size, except under `bnpo` (a token
    mean per pass) and a top-entropy quantile below 1 (a quantile per pass): those then train on one of the
    splits TRL's shuffle draws, always the same one. TRL's own scoring runs where a call needs more than
    token ids (images, a mixture-of-experts loss), where gradient checkpointing is on (the layers then drop
    a cache) and where processes train together (DDP's wrapper expects one forward a backward)."""
    import torch
    from trl import GRPOTrainer
    from trl.trainer import grpo_trainer

    from shared_prompts import completion_scores

    original = GRPOTrainer._get_per_token_logps_and_entropies

    def scores(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **media,
    ):
        if (
            compute_aux_loss
            or self.args.gradient_checkpointing
            or self.accelerator.num_processes > 1
            or any(v is not None for v in media.values())
        ):
            return original(
                self, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy,
                compute_aux_loss, **media,
            )  # fmt: skip
        size = batch_size or input_ids.shape[0]
        row_chunks = [slice(i, i + size) for i in range(0, input_ids.shape[0], size)]
        with self.accelerator.autocast():
            parts = [
                completion_scores(model, input_ids[r], attention_mask[r], logits_to_keep, compute_entropy)
                for r in row_chunks
            ]
        logps = torch.cat([logp for logp, _ in parts])
        entropies = torch.cat([entropy for _, entropy in parts]) if compute_entropy else None
        return logps, entropies, None

    with (
        replaced(GRPOTrainer, "_get_per_token_logps_and_entropies", scores),
        replaced(grpo_trainer, "shuffle_sequence_dict", in_round_order),
    ):
        yield


@contextmanager
def fast_sampling(model) -> Iterator[None]:
    """`generate` on the CPU (in training and evaluation) with the LM head's input contiguous, one random
    draw per sampled token, and the LoRA in two operations a layer (the update's too, inside fast_kernels,
    so that both compute alike). Nothing changes on a GPU."""
    if not on_cpu():
        yield
        return
    with contiguous_head_input(model), inverse_cdf_draws(), lean_lora():
        yield


@contextmanager
def fast_kernels(model, autocast: bool) -> Iterator[None]:
    """For the duration (a training run) on the CPU, the choices above and, under bf16 autocast, the
    LoRA's input left in bf16: PEFT casts each LoRA's input to its float32 weights' dtype, which autocast
    then casts back to bf16 for the matmul, two copies of the activations per LoRA and pass for nothing
    (PEFT's own switch, disable_input_dtype_casting). Nothing changes on a GPU."""
    if not on_cpu():
        yield
        return
    from peft.helpers import disable_input_dtype_casting

    with (
        plain_gqa(),
        packed_gqa(),
        completion_scoring(),
        lean_lm_head(),
        shared_prompt_passes(),
        dropout_masks_from_bits(),
        fast_sampling(model),
        disable_input_dtype_casting(model, active=autocast),
    ):
        yield
