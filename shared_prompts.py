"""A group's prompt run through the model once, in sampling and in the update.

GRPO samples every prompt GRPO_NUM_GENERATIONS times, and TRL runs each row on its own: at the seed's shape a
round runs its 2 prompts 16 times when sampling and 16 times again in the update's forward and backward,
where the prompt (the instructions, the worked example, the task: about 420 tokens of the real model's) is
longer than the completion it leads to. Running each distinct prompt once and handing its keys and values
to every row that continues it computes the same attention, as a KV cache does in `generate`: the rows'
queries see the same keys and values, at the same relative positions (RoPE), so the same log-probabilities
up to float rounding. In the update the cache keeps its autograd graph, so a prompt's gradient is the sum
over the rows that share it, exactly what the rows' own prompts would have added up to.

A pass's rows that share prompts run after them in forwards of like completion lengths (length_buckets), each
up to its own longest: one completion that ran to the limit pads only its own forward, for the cost of a
forward more.

Where the rows of a call share no prompt nothing is shared; the columns no row attends to (the left
padding of a batch whose longest prompt is in another pass, the right padding after a batch's longest
completion) are left out of the update's forward as well, which changes no value: a masked column is no
key to any row, and under the causal mask no earlier position sees a later one.
"""

from __future__ import annotations

import math

import torch
from transformers import DynamicCache, PreTrainedModel

# What one more forward and backward costs beyond its positions, counted in positions (length_buckets): an
# estimate (a forward of the real 0.5B runs about a thousand kernels whatever its length); in a probe of the
# real 0.5B, 0 (a forward a length) and 32 took alike, 128 a little longer, one padded forward far longer.
BUCKET_OVERHEAD = 32


def left_padded_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """The position of each column of left-padded rows, as `generate` gives them: a row's first attended
    column is 0, its padding 1. The cached prompt and what follows it must be given the same ones."""
    return (attention_mask.cumsum(-1) - 1).masked_fill_(attention_mask == 0, 1)


def distinct_prompt_cache(
    policy: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[DynamicCache, torch.Tensor] | None:
    """A KV cache of each distinct row (prompt) of `input_ids` but its last token, each run through `policy`
    once at the positions `generate` gives left-padded rows, and the index of every row's prompt in it. None
    where every row's prompt is its own. Under autograd the cache carries the prompts' graph."""
    rows = torch.cat([input_ids, attention_mask], dim=1)
    distinct, row_of = torch.unique(rows, dim=0, return_inverse=True)
    if len(distinct) == len(rows) or input_ids.shape[1] < 2:
        return None
    ids, mask = distinct.split(input_ids.shape[1], dim=1)
    positions = left_padded_positions(mask)
    cache = DynamicCache(config=policy.config)
    policy(
        input_ids=ids[:, :-1],
        attention_mask=mask[:, :-1],
        position_ids=positions[:, :-1],
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    return cache, row_of


def rows_cache(policy: PreTrainedModel, prompts: DynamicCache, prompt_of: torch.Tensor) -> DynamicCache:
    """A new cache holding, row by row, the cached prompt `prompt_of` names (its keys and values indexed:
    under autograd, gradients flow back to the prompts' cache)."""
    return DynamicCache(
        ((keys[prompt_of], values[prompt_of]) for keys, values, _ in prompts), config=policy.config
    )


def shared_prompt_cache(
    policy: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> DynamicCache | None:
    """A KV cache of every row's prompt but its last token where rows share prompts (a group's completions
    all continue one prompt): each distinct prompt runs through `policy` once and its keys and values are
    repeated for the rows that share it (distinct_prompt_cache); `generate`, given the cache, runs each row's
    last prompt token and samples on. A round of 2 prompts x 8 completions runs 2 prompts where it ran 16.
    None where every row's prompt is its own."""
    prompts = distinct_prompt_cache(policy, input_ids, attention_mask)
    if prompts is None:
        return None
    cache, row_of = prompts
    cache.batch_select_indices(row_of)
    return cache


def attended_columns(attention_mask: torch.Tensor, prompt_width: int) -> tuple[int, int]:
    """The first and one past the last column any row attends to, keeping at least the last prompt column
    and the first completion column (`prompt_width` columns of left-padded prompts, then the completions)."""
    attended = attention_mask.bool().any(0)
    first = int(attended[:prompt_width].int().argmax()) if bool(attended[:prompt_width].any()) else 0
    last = int(attended.nonzero().max()) if bool(attended.any()) else prompt_width
    return min(first, prompt_width - 1), max(last + 1, prompt_width + 1)


def right_padded(scores: torch.Tensor, width: int) -> torch.Tensor:
    """`scores` (rows, its width) with zeros appended up to `width` columns."""
    return torch.nn.functional.pad(scores, (0, width - scores.shape[1]))


def length_buckets(lengths: list[int], overhead: int = BUCKET_OVERHEAD) -> list[list[int]]:
    """The rows (indices into `lengths`, each row's completion length) split into forwards of rows of like
    length, each forward run up to its longest: of all splits of the rows sorted by length into runs, the one
    of the fewest positions, each forward counted as `overhead` positions more (exact, by dynamic
    programming over the split points)."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    cost, split = [0] + [math.inf] * len(order), [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        for begin in range(end):
            total = cost[begin] + (end - begin) * lengths[order[end - 1]] + overhead
            if total < cost[end]:
                cost[end], split[end] = total, begin
    buckets, end = [], len(order)
    while end:
        buckets.append(order[split[end] : end])
        end = split[end]
    return buckets[::-1]


def completion_scores(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_width: int,
    compute_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The per-token log-probabilities (rows, `completion_width`) of the last `completion_width` columns of
    `input_ids` (left-padded prompts, then right-padded completions, as TRL's trainer joins them), and their
    entropies if asked: what TRL's `model(..., labels=..., fused_lm_head=True)` gives them, computed with
    each distinct prompt run once, the rows that share prompts in forwards of like completion lengths
    (length_buckets), and the unattended columns left out (the module docstring says why). Columns past a
    row's completion score 0, as TRL's masked positions do."""
    prompt_width = input_ids.shape[1] - completion_width
    first, end = attended_columns(attention_mask, prompt_width)
    ids, mask = input_ids[:, first:end], attention_mask[:, first:end]
    prompt_width -= first
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :prompt_width] = -100
    lengths = mask[:, prompt_width:].sum(1).clamp(min=1)
    prompts = distinct_prompt_cache(model, ids[:, :prompt_width], mask[:, :prompt_width])
    # Rows of their own prompts run together at the model's own positions, as in TRL's call.
    buckets = length_buckets(lengths.tolist()) if prompts else [list(range(len(ids)))]
    logps, entropies = [], []
    for rows in buckets:
        width = int(lengths[rows].max())
        cut = prompt_width + width
        if prompts is None:
            start, positions, cache = 0, None, None
        else:  # each row's last prompt token, then its completion, after the cached prompt
            start = prompt_width - 1
            positions = left_padded_positions(mask[rows, :cut])[:, start:]
            cache = rows_cache(model, prompts[0], prompts[1][rows])
        outputs = model(
            input_ids=ids[rows, start:cut],
            attention_mask=mask[rows, :cut],
            position_ids=positions,
            past_key_values=cache,
            labels=labels[rows, start:cut],
            fused_lm_head=True,
        )
        logps.append(right_padded(outputs.log_probs[:, -width:], completion_width))
        if compute_entropy:
            entropies.append(right_padded(outputs.entropy[:, -width:], completion_width))
    in_row_order = torch.tensor([row for rows in buckets for row in rows]).argsort()
    return torch.cat(logps)[in_row_order], torch.cat(entropies)[in_row_order] if compute_entropy else None
