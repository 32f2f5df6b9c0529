"""continuous_batching.py on the tiny model: prompts join a running batch between chunks as rows end, and
every row writes what it writes decoding alone."""

from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

import models
from continuous_batching import generate_continuously
from problems import BUNDLED_PROBLEMS, load_problems

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NAMES = (
    "count_vowels",
    "sum_of_squares",
    "last_element",
    "factorial_tail",
    "max_option",
    "gcd",
    "lcs_length",
)


@pytest.fixture(scope="module")
def lora_model(tiny_model: Path):
    """The tiny model with a seeded random LoRA (its rows then differ), and its tokenizer."""
    from peft import LoraConfig, get_peft_model

    base, tokenizer = models.load_base(str(tiny_model))
    torch.manual_seed(0)
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    return get_peft_model(base, lora).eval(), tokenizer


def test_prompts_join_as_rows_end_and_each_row_writes_what_it_writes_alone(lora_model) -> None:
    """Greedy decoding, 7 prompts of different lengths through 3 slots, 4 tokens a call: each row's tokens up
    to its end token (or its 20-token limit) are those of the prompt decoded alone, with no padding; no call
    holds more than 3 rows; prompts join a batch that still has rows running (a wider or narrower one, so
    both sides get left-padded)."""
    from transformers import GenerationConfig

    model, tokenizer = lora_model
    problems = {p["id"]: p for p in load_problems(str(BUNDLED_PROBLEMS))}
    texts = [problems[n]["problem"][: 60 + 40 * i] for i, n in enumerate(NAMES)]  # prompts of many widths
    plain = GenerationConfig(do_sample=False, max_new_tokens=20, pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():
        alone = [
            model.generate(**(inputs := tokenizer(text, return_tensors="pt")), generation_config=plain)[
                0, inputs["input_ids"].shape[1] :
            ].tolist()
            for text in texts
        ]
    end = alone[0][2]  # a token that ends some rows early and not others
    ends = [row.index(end) + 1 if end in row else len(row) for row in alone]
    assert min(ends) < 8 and max(ends) == 20, ends
    greedy = GenerationConfig(
        do_sample=False, max_new_tokens=20, pad_token_id=tokenizer.pad_token_id, eos_token_id=end
    )
    calls: list[tuple[int, int]] = []  # (rows, new tokens) of each generate call
    generate = model.generate

    def counted(**kwargs):
        calls.append((len(kwargs["input_ids"]), kwargs["generation_config"].max_new_tokens))
        return generate(**kwargs)

    def encode(indexes):
        return tokenizer([texts[i] for i in indexes], return_tensors="pt", padding=True, padding_side="left")

    model.generate = counted
    try:
        with torch.no_grad():
            written = generate_continuously(model, encode, len(texts), greedy, {end}, slots=3, chunk=4)
    finally:
        del model.generate
    assert [row[:n] for row, n in zip(written, ends, strict=True)] == [
        row[:n] for row, n in zip(alone, ends, strict=True)
    ]
    assert all(len(row) <= 20 for row in written)
    assert max(rows for rows, _ in calls) == 3
    joins = [i for i, (_, tokens) in enumerate(calls) if tokens == 1]
    assert len(joins) > 3  # more joins than batches of 3: prompts joined rows still running
    assert any(calls[i + 1][0] > calls[i][0] for i in joins)  # joined rows decode with others running


def cache_of(ids: torch.Tensor, mask: torch.Tensor) -> DynamicCache:
    """A two-layer cache whose keys and values at each column hold that column's token id where the row
    attends to it (0 where it does not): every position but the last, as after a generate call."""
    marks = (ids * mask)[:, None, :-1, None].float().expand(-1, 2, -1, 3)
    return DynamicCache([(marks.clone(), -marks), (2 * marks, -2 * marks)])


def assert_cache_matches_tokens(batch) -> None:
    expected = cache_of(batch.ids, batch.mask)
    for layer, want in zip(batch.cache.layers, expected.layers, strict=True):
        assert torch.equal(layer.keys, want.keys) and torch.equal(layer.values, want.values)


def test_batches_join_and_drop_rows_keeping_each_cache_column_with_its_token() -> None:
    """Batch.join left-pads the narrower batch (ids, mask and cache), Batch.select drops rows and then the
    columns no row attends to: after both, each row's cache still holds at each column the token of that
    column, and padding only where the mask is 0."""
    from continuous_batching import Batch

    def batch(rows: list[int], ids: list[list[int]], mask: list[list[int]]) -> Batch:
        ids_t, mask_t = torch.tensor(ids), torch.tensor(mask)
        return Batch(rows, ids_t, mask_t, cache_of(ids_t, mask_t))

    running = batch([0, 1], [[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]], [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    fresh = batch([2, 3], [[0, 21, 22], [31, 32, 33]], [[0, 1, 1], [1, 1, 1]])
    running.join(fresh, pad_id=0)
    assert running.rows == [0, 1, 2, 3]
    assert running.ids.tolist() == [
        [0, 0, 5, 6, 7],
        [8, 9, 10, 11, 12],
        [0, 0, 0, 21, 22],
        [0, 0, 31, 32, 33],
    ]
    assert running.mask.tolist() == [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 1, 1], [0, 0, 1, 1, 1]]
    assert_cache_matches_tokens(running)
    running.select([0, 2, 3])  # the widest row leaves: two columns no row attends to go
    assert running.rows == [0, 2, 3]
    assert running.ids.tolist() == [[5, 6, 7], [0, 21, 22], [31, 32, 33]]
    assert running.mask.tolist() == [[1, 1, 1], [0, 1, 1], [1, 1, 1]]
    assert_cache_matches_tokens(running)
    # wider fresh rows pad the running ones instead
    wider = batch([4], [[41, 42, 43, 44, 45, 46]], [[1, 1, 1, 1, 1, 1]])
    running.join(wider, pad_id=0)
    assert running.ids.tolist() == [
        [0, 0, 0, 5, 6, 7],
        [0, 0, 0, 0, 21, 22],
        [0, 0, 0, 31, 32, 33],
        [41, 42, 43, 44, 45, 46],
    ]
    assert_cache_matches_tokens(running)
