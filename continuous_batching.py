"""Sampling many prompts with every slot of the batch busy: continuous batching between chunks.

A `generate` call decodes until its longest row ends, and a decoding step costs nearly the same with one row
as with thirty-two (it reads every weight either way). An evaluation whose batch waits for one runaway to the
token limit pays for a full batch per step while the rest of its rows have long ended. Here a batch
decodes `chunk` tokens a call; between calls the rows that ended leave it, with their part of the KV cache,
and prompts still waiting take their places: they run through the model (their prompt and a first token,
in one call of their own through the model's `generate`, so through whatever sampler is installed there) and
join the cache, each side left-padded to the wider. Every row is sampled from the distribution one call would
sample it from (the processors act row by row; positions follow each row's attention mask), by other random
draws.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence

import torch
from transformers import DynamicCache, GenerationConfig, StoppingCriteriaList, StopStringCriteria
from transformers.cache_utils import DynamicLayer


class Batch:
    """The rows decoding together: which prompt each continues, their token ids (left-padded: prompt, then
    what they wrote), the attention mask, and the KV cache of every position but the last (None before the
    batch's first call)."""

    def __init__(
        self, rows: list[int], ids: torch.Tensor, mask: torch.Tensor, cache: DynamicCache | None = None
    ) -> None:
        self.rows, self.ids, self.mask, self.cache = rows, ids, mask, cache

    def select(self, kept: list[int]) -> None:
        """Keep the rows at positions `kept`, then drop the columns no row attends to any more (the left
        padding of rows that left); the others keep their positions, which the mask gives."""
        index = torch.tensor(kept, dtype=torch.long, device=self.ids.device)
        self.cache.batch_select_indices(index)
        self.rows = [self.rows[i] for i in kept]
        self.ids, self.mask = self.ids[index], self.mask[index]
        if self.rows:
            unused = int(self.mask.any(0).long().argmax())  # a row's last column is always attended
            self.ids, self.mask = self.ids[:, unused:], self.mask[:, unused:]
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, unused:], layer.values[:, :, unused:]

    def pad_left(self, width: int, pad_id: int) -> None:
        """Widen this batch to `width` columns by left padding: masked columns, zero keys and values."""
        pad = width - self.ids.shape[1]
        if pad == 0:
            return
        self.ids = torch.cat([self.ids.new_full((len(self.rows), pad), pad_id), self.ids], dim=1)
        self.mask = torch.cat([self.mask.new_zeros(len(self.rows), pad), self.mask], dim=1)
        for layer in self.cache.layers:
            zeros = layer.keys.new_zeros(*layer.keys.shape[:2], pad, layer.keys.shape[3])
            layer.keys, layer.values = torch.cat([zeros, layer.keys], 2), torch.cat([zeros, layer.values], 2)

    def join(self, other: Batch, pad_id: int) -> None:
        """Take `other`'s rows in after this batch's, both left-padded to the wider of the two."""
        width = max(self.ids.shape[1], other.ids.shape[1])
        self.pad_left(width, pad_id)
        other.pad_left(width, pad_id)
        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            mine.keys = torch.cat([mine.keys, theirs.keys])
            mine.values = torch.cat([mine.values, theirs.values])
        self.rows += other.rows
        self.ids, self.mask = torch.cat([self.ids, other.ids]), torch.cat([self.mask, other.mask])


def joinable(cache: DynamicCache) -> bool:
    """Whether rows can be added to `cache` by left padding: every layer a plain dynamic one (a sliding
    window's or a quantized layer keeps other state that padding would break)."""
    return all(type(layer) is DynamicLayer and layer.is_initialized for layer in cache.layers)


def generate_continuously(
    model,
    encode: Callable[[Sequence[int]], Mapping],
    count: int,
    sampling: GenerationConfig,
    ended: set[int],
    *,
    slots: int,
    chunk: int,
    tokenizer=None,
    progress: Callable[[int], None] | None = None,
) -> list[list[int]]:
    """The new token ids of prompts 0 to `count` - 1 (`encode` gives the left-padded input_ids and
    attention_mask of the prompts it is given), each sampled with `sampling` up to its max_new_tokens, at
    most `slots` rows decoding at a time, `chunk` tokens a call. A row leaves after the call in which it
    wrote a token of `ended` or reached its token limit; the tokens it wrote after the limit are dropped.
    A stop string that completes on a call's last token is not seen by the next call (the callers' readers
    cut the text at its first stop sequence); `tokenizer` matches `sampling`'s stop strings. `progress` gets
    the number of prompts done whenever rows have ended."""
    step = copy.deepcopy(sampling)
    step.return_dict_in_generate = True
    stops = StoppingCriteriaList()
    if sampling.stop_strings:  # one criterion for every call: building it reads the whole vocabulary
        stops.append(StopStringCriteria(tokenizer, sampling.stop_strings))
        step.stop_strings = None
    limit = sampling.max_new_tokens
    pad_id = sampling.pad_token_id if sampling.pad_token_id is not None else 0
    new: list[list[int]] = [[] for _ in range(count)]
    waiting, done = list(range(count)), 0

    def decoded(batch: Batch, tokens: int) -> Batch:
        """`batch` after a call of `tokens` new tokens, less the rows that ended or reached the limit."""
        nonlocal done
        step.max_new_tokens = tokens
        out = model.generate(
            input_ids=batch.ids,
            attention_mask=batch.mask,
            past_key_values=batch.cache,
            generation_config=step,
            stopping_criteria=stops,
        )
        added = out.sequences[:, batch.ids.shape[1] :]
        kept = []
        for i, (row, tokens_of_row) in enumerate(zip(batch.rows, added.tolist(), strict=True)):
            new[row] = (new[row] + tokens_of_row)[:limit]
            if ended.isdisjoint(tokens_of_row) and len(new[row]) < limit:
                kept.append(i)
        done += len(batch.rows) - len(kept)
        mask = torch.cat([batch.mask, batch.mask.new_ones(len(batch.rows), added.shape[1])], dim=1)
        after = Batch(batch.rows, out.sequences, mask, out.past_key_values)
        after.select(kept)
        return after

    running: Batch | None = None
    while waiting or running:
        before = done
        room = slots - (len(running.rows) if running else 0)
        if waiting and room > 0 and (running is None or joinable(running.cache)):
            joining, waiting = waiting[:room], waiting[room:]
            inputs = encode(joining)
            fresh = Batch(joining, inputs["input_ids"], inputs["attention_mask"])
            fresh = decoded(fresh, 1)  # the prompts and a first token, through the model's own generate
            if running is None:
                running = fresh if fresh.rows else None
            elif fresh.rows:
                running.join(fresh, pad_id)
        if running:
            running = decoded(running, min(chunk, max(limit - len(new[row]) for row in running.rows)))
            running = running if running.rows else None
        if progress and done > before:
            progress(done)
    return new
