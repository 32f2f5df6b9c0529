"""cpu_training.py's CPU choices on the tiny model: the LM head's contiguous input (a prompt's first forward
in `generate` hands the head a slice whose rows lie a prompt apart, which torch multiplies by expanding the
head's weight to one copy per row; under contiguous_head_input the head reads a contiguous copy and the
logits are the same), one draw per sampled token, and dropout's masks from 16 random bits an element."""

import contextlib
from pathlib import Path
from unittest import mock

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

import cpu_training
import train
from bench.train_step import prompt_batch
from conftest import SEVEN
from problems import BUNDLED_PROBLEMS, load_problems
from settings import TrainConfig

pytestmark = [
    pytest.mark.usefixtures("one_torch_thread"),
    pytest.mark.skipif(
        not cpu_training.on_cpu(), reason="the fix is the CPU's; a GPU box keeps transformers' path"
    ),
]


def head_inputs_and_scores(model, ids, mask, fixed: bool) -> tuple[list[bool], torch.Tensor, torch.Tensor]:
    """Whether each LM-head call's input was contiguous (as the head gets it, after the fix's own hook), the
    greedy tokens and their scores."""
    seen: list[bool] = []
    config = GenerationConfig(
        max_new_tokens=6, do_sample=False, output_scores=True, return_dict_in_generate=True
    )
    with cpu_training.contiguous_head_input(model) if fixed else contextlib.nullcontext():
        watch = model.get_output_embeddings().register_forward_pre_hook(
            lambda _, args: seen.append(args[0].is_contiguous())
        )
        try:
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        finally:
            watch.remove()
    return seen, out.sequences, torch.stack(out.scores)


def test_the_lm_head_reads_a_contiguous_input_and_gives_the_same_logits(tiny_model: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16).eval()
    ids, mask = prompt_batch(tokenizer, load_problems(str(BUNDLED_PROBLEMS))[:3])
    assert (mask == 0).any(), "the prompts must differ in length, as a round's do"

    seen, tokens, scores = head_inputs_and_scores(model, ids, mask, fixed=False)
    assert seen[0] is False  # the prefill's last-position slice: what costs the weight copies
    fixed_seen, fixed_tokens, fixed_scores = head_inputs_and_scores(model, ids, mask, fixed=True)
    assert all(fixed_seen) and len(fixed_seen) == len(seen)
    assert torch.equal(fixed_tokens, tokens)
    assert torch.equal(fixed_scores, scores)
    assert not model.get_output_embeddings()._forward_pre_hooks  # the fix leaves with the context


def test_inverse_cdf_draws_follow_the_weights_and_never_a_zero() -> None:
    weights = torch.tensor([0.0, 0.5, 0.0, 0.2, 0.3, 0.0]) * 7  # unnormalised, as generate's rows may be
    rows = 200_000
    generator = torch.Generator().manual_seed(0)
    drawn = cpu_training.inverse_cdf_draw(weights.expand(rows, -1), generator)
    assert drawn.shape == (rows, 1) and drawn.dtype == torch.long
    counts = torch.bincount(drawn.squeeze(1), minlength=len(weights)).double()
    expected = weights.double() / weights.sum() * rows
    assert torch.equal(counts[expected == 0], torch.zeros(3, dtype=torch.double))
    spread = (expected * (1 - expected / rows)).sqrt()  # the binomial's standard deviation
    assert ((counts - expected).abs() <= 5 * spread).all(), (counts, expected)


def test_inverse_cdf_draws_cross_blocks_and_a_short_last_block() -> None:
    """Weight in the first block, none in the second but at its ends' neighbours, and some in the last,
    shorter block (300 entries: blocks of 128, 128 and 44)."""
    assert cpu_training.DRAW_BLOCK == 128
    weights = torch.zeros(300)
    weights[[0, 127, 256, 299]] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    rows = 100_000
    drawn = cpu_training.inverse_cdf_draw(weights.expand(rows, -1), torch.Generator().manual_seed(1))
    counts = torch.bincount(drawn.squeeze(1), minlength=len(weights)).double()
    expected = weights.double() / weights.sum() * rows
    assert counts[expected == 0].sum() == 0
    spread = (expected * (1 - expected / rows)).sqrt()
    assert ((counts - expected).abs() <= 5 * spread).all(), counts[expected > 0]


def test_a_draw_picks_what_a_cumulative_sum_of_the_whole_row_picks() -> None:
    """The same uniform draws give the same tokens as the one-level sum before the blocks (the random stream
    of a seed is kept), for rows of 1,000 random weights, some of them 0."""
    probs = torch.rand(20_000, 1000, generator=torch.Generator().manual_seed(2))
    probs = probs.masked_fill(probs < 0.3, 0).softmax(-1).masked_fill(probs < 0.3, 0)
    drawn = cpu_training.inverse_cdf_draw(probs, torch.Generator().manual_seed(3))
    cumulative = probs.cumsum(-1, dtype=torch.float64)
    total = cumulative[:, -1:]
    draw = torch.rand(total.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * total
    assert torch.equal(drawn, torch.searchsorted(cumulative, draw, right=True))


def test_multinomial_is_replaced_only_where_it_is_one_draw_per_row_on_the_cpu() -> None:
    probs = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    original = torch.multinomial
    with cpu_training.inverse_cdf_draws():
        assert torch.multinomial(probs, 1).tolist() == [[1], [2]]
        assert torch.multinomial(probs[0], 1).tolist() == [1]  # a vector: torch's own
        assert torch.multinomial(probs, 2, replacement=True).shape == (2, 2)
        with pytest.raises(RuntimeError, match="probability tensor contains"):
            torch.multinomial(torch.tensor([[float("nan"), 1.0]]), 1)  # torch's own error
    assert torch.multinomial is original


def test_generate_samples_through_one_draw_per_token(tiny_model: Path) -> None:
    """With top-k 1 every row has one token of weight > 0, so the sampled tokens are the greedy ones; each
    decoding step's draw went through inverse_cdf_draw."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16).eval()
    ids, mask = prompt_batch(tokenizer, load_problems(str(BUNDLED_PROBLEMS))[:3])
    length = {"max_new_tokens": 5, "min_new_tokens": 5}
    greedy = model.generate(input_ids=ids, attention_mask=mask, **length, do_sample=False)
    with (
        mock.patch.object(cpu_training, "inverse_cdf_draw", wraps=cpu_training.inverse_cdf_draw) as draws,
        cpu_training.fast_sampling(model),
    ):
        sampled = model.generate(input_ids=ids, attention_mask=mask, **length, do_sample=True, top_k=1)
    assert torch.equal(sampled, greedy)
    assert draws.call_count == 5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_from_bits_drops_its_share_in_every_lane_and_keeps_the_mean(dtype) -> None:
    """Each of the four 16-bit lanes of a 64-bit draw drops its share (torch's `random_()` leaves an int64's
    top bit 0, which would never drop an element of the fourth lane), the rest scaled so the mean holds, and
    the gradient is the mask."""
    dropped = round(0.05 * 65536)
    share = dropped / 65536
    x = torch.ones(4 * 100_000, dtype=dtype, requires_grad=True)
    torch.manual_seed(0)
    out = cpu_training.dropout_from_bits(x, dropped)
    zero = (out == 0).view(-1, 4).double()
    spread = (share * (1 - share) / len(zero)) ** 0.5
    assert ((zero.mean(0) - share).abs() <= 5 * spread).all(), zero.mean(0)
    scale = torch.tensor(65536 / (65536 - dropped), dtype=dtype)
    assert torch.equal(out[out != 0], scale.expand(int((out != 0).sum())))
    out.sum().backward()
    assert torch.equal(x.grad, out.detach())
    torch.manual_seed(0)
    assert torch.equal(cpu_training.dropout_from_bits(x.detach(), dropped), out.detach())  # torch's seed


def test_dropout_is_drawn_from_bits_only_in_training_and_on_the_cpu() -> None:
    x = torch.ones(64, 64)
    original = torch.nn.functional.dropout
    with (
        mock.patch.object(cpu_training, "dropout_from_bits", wraps=cpu_training.dropout_from_bits) as bits,
        cpu_training.dropout_masks_from_bits(),
    ):
        assert 0 < int((torch.nn.Dropout(0.05)(x) == 0).sum()) < x.numel() and bits.call_count == 1
        assert torch.equal(torch.nn.Dropout(0.05).eval()(x), x)
        assert torch.equal(torch.nn.Dropout(0.0)(x), x)
        assert torch.equal(torch.nn.Dropout(1.0)(x), torch.zeros_like(x))
        torch.nn.Dropout(0.05, inplace=True)(x.clone())
        assert bits.call_count == 1  # eval, p 0 and 1 and in place: torch's own
    assert torch.nn.functional.dropout is original


def test_a_training_forward_of_the_lora_draws_its_dropout_from_bits(tiny_model: Path) -> None:
    """Every LoRA dropout of a training forward (seven projections in every layer) goes through
    dropout_from_bits under fast_kernels; a forward in eval mode (as sampling's) draws none."""
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16)
    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules=SEVEN, task_type="CAUSAL_LM")
    model = get_peft_model(base, config)
    ids = torch.randint(5, 2000, (2, 12))
    with (
        mock.patch.object(cpu_training, "dropout_from_bits", wraps=cpu_training.dropout_from_bits) as bits,
        cpu_training.fast_kernels(model, autocast=True),
    ):
        for training in (True, False):
            model.train(training)
            with torch.autocast("cpu", dtype=torch.bfloat16):  # as the trainer's update (fast_kernels)
                model(input_ids=ids).logits.float().sum().backward()
            assert bits.call_count == 7 * base.config.num_hidden_layers


def shape(batch: int, generations: int, checkpointing: str = "auto") -> TrainConfig:
    """The settings of a round of `batch` prompts x `generations` completions of 704 + 256 positions."""
    return TrainConfig(
        per_device_train_batch_size=batch,
        num_generations=generations,
        max_prompt_length=704,
        max_completion_length=256,
        gradient_checkpointing=checkpointing,
    )


GIB = 2**30


@pytest.mark.parametrize(
    ("cfg", "processes", "memory", "expected"),
    [
        # A pass of 2 would hold part of a group of 8: a group a pass, 704 + 8 x 256 positions, fits.
        (shape(2, 8), 1, 24 * GIB, (False, True, 2752)),
        # Passes of 4 hold whole groups of 2 already: TRL's passes.
        (shape(4, 2), 1, 24 * GIB, (False, False, 3840)),
        # DDP's wrapper expects one forward a backward: TRL's passes.
        (shape(2, 8), 2, 24 * GIB, (False, False, 1920)),
        # Checkpointing drops the cache a shared prompt needs: TRL's passes.
        (shape(2, 8, "on"), 1, 24 * GIB, (True, False, 1920)),
        # The group's pass does not fit without checkpointing, TRL's does: TRL's, without.
        (shape(2, 8), 1, 2500 * GIB // 1000, (False, False, 1920)),
        # Neither fits: TRL's passes, with checkpointing.
        (shape(2, 8), 1, 1000 * GIB // 1000, (True, False, 1920)),
    ],
)
def test_a_pass_holds_a_whole_group_where_it_would_split_one_and_fits(
    cfg, processes, memory, expected
) -> None:
    def peak(tokens: int) -> int:  # an estimate of a GiB a thousand positions
        return tokens * GIB // 1000

    checkpointing, why, whole_groups = cpu_training.update_passes(cfg, processes, peak, memory)
    assert (checkpointing, whole_groups, cpu_training.update_pass_tokens(cfg, whole_groups)) == expected
    assert why == "as set" if cfg.gradient_checkpointing == "on" else why.startswith("auto: estimated peak")


def test_a_group_per_pass_keeps_the_round_and_its_optimizer_step() -> None:
    args = train.grpo_args(shape(2, 8), use_bf16=False)
    rows = args.generation_batch_size
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps, rows) == (2, 8, 16)
    cpu_training.group_per_pass(args, 8)
    assert (
        args.per_device_train_batch_size,
        args.gradient_accumulation_steps,
        args.steps_per_generation,
    ) == (8, 2, 2)
    assert args.generation_batch_size == rows
