"""cpu_training.py's CPU choices on the tiny model: the LM head's contiguous input (a prompt's first forward
in `generate` hands the head a slice whose rows lie a prompt apart, which torch multiplies by expanding the
head's weight to one copy per row; under contiguous_head_input the head reads a contiguous copy and the
logits are the same), one draw per sampled token, the LM head's tiles folded as TRL folds them, the LoRA in
one addmm after A, and dropout's masks from 16 random bits an element."""

import contextlib
import math
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


def head_tile_arguments(logit_scale: float) -> tuple[torch.Tensor, tuple, dict]:
    """A bf16 tile of 37 tokens' logits over vocabulary columns 300 to 599 and the rest of a call of TRL's
    `_backward_tile`: targets inside the tile and outside it, the forward's log-normaliser, a gradient."""
    generator = torch.Generator().manual_seed(4)
    tile = (torch.randn(37, 300, generator=generator) * 3).bfloat16()
    targets = torch.randint(0, 900, (37,), generator=generator)
    targets[:3] = torch.tensor([300, 599, 450])
    log_z = torch.logsumexp(tile.float() * logit_scale / 0.9, -1) + torch.rand(37, generator=generator)
    grad = torch.randn(37, generator=generator)
    rest = (targets, log_z, log_z, grad, None, 300, 300)
    flags = {
        "logit_scale": logit_scale, "softcap": 1.0, "inv_t": 1 / 0.9, "HAS_SOFTCAP": False,
        "HAS_LOGPROB_GRAD": True, "HAS_ENTROPY_GRAD": False, "BLOCK_SIZE": 1024,
    }  # fmt: skip
    return tile, rest, flags


@pytest.mark.parametrize("logit_scale", [1.0, 0.5])
def test_the_lm_heads_tile_gradient_is_trls_bit_for_bit(logit_scale: float) -> None:
    from trl.kernels import chunked_logprob

    tile, rest, flags = head_tile_arguments(logit_scale)
    trls, ours = tile.clone(), tile.clone()
    chunked_logprob._backward_tile(trls, trls.stride(0), *rest, **flags)
    cpu_training.lm_head_tile_gradient(chunked_logprob._backward_tile)(ours, ours.stride(0), *rest, **flags)
    assert not torch.equal(trls, tile)
    assert torch.equal(ours, trls)


@pytest.mark.parametrize(("logit_scale", "entropy"), [(1.0, True), (0.5, True), (1.0, False)])
def test_the_lm_heads_tile_statistics_are_trls_bit_for_bit(logit_scale: float, entropy: bool) -> None:
    """Folded after a first tile (running statistics already set), with and without the entropy's sum."""
    from trl.kernels import chunked_logprob

    tile, (targets, *_), flags = head_tile_arguments(logit_scale)
    flags = {
        **{k: flags[k] for k in ("logit_scale", "softcap", "inv_t", "HAS_SOFTCAP", "BLOCK_SIZE")},
        "HAS_ENTROPY": entropy, "HAS_LOG_SUM_SQ_PROBS": False, "HAS_MEAN_LOGITS": False, "HAS_IS_TOP1": False,
    }  # fmt: skip

    def folded(fold) -> list[torch.Tensor]:
        stats = [torch.full((37,), -math.inf), *(torch.zeros(37) for _ in range(4))]
        stats += [torch.full((37,), -math.inf), torch.zeros(37)]
        for start, part in ((0, tile[:, :150]), (150, tile[:, 150:])):
            fold(part, part.stride(0), targets - 300, *stats, start, 150, **flags)
        return stats

    trls = folded(chunked_logprob._forward_tile)
    ours = folded(cpu_training.lm_head_tile_statistics(chunked_logprob._forward_tile))
    assert all(torch.equal(a, b) for a, b in zip(ours, trls, strict=True))
    assert trls[2].abs().sum() > 0 if entropy else trls[2].abs().sum() == 0


def test_the_lm_heads_tile_gradient_leaves_an_entropy_gradient_to_trl() -> None:
    tile, rest, flags = head_tile_arguments(1.0)
    original = mock.Mock()
    call = (tile, tile.stride(0), *rest)
    cpu_training.lm_head_tile_gradient(original)(*call, **{**flags, "HAS_ENTROPY_GRAD": True})
    original.assert_called_once_with(*call, **{**flags, "HAS_ENTROPY_GRAD": True})


def test_the_lm_heads_gradient_product_sums_bf16_products_in_float32() -> None:
    """acc += a @ b as TRL's float32 GEMM sums it (within float32 rounding, far inside the error of a bf16
    product), and again after b's weight changes in place (its kept float32 copy is not reused); a b of its
    own (no slice of a kept weight) gives the same."""
    from trl.kernels import chunked_logprob

    generator = torch.Generator().manual_seed(5)
    a = torch.randn(40, 3000, generator=generator).bfloat16()
    weight = torch.randn(3000, 64, generator=generator).bfloat16()
    product = cpu_training.lm_head_gradient_product(chunked_logprob._addmm_fp32)
    for _ in range(2):
        exact = a.double() @ weight.double()
        trls, ours = torch.ones(40, 64), torch.ones(40, 64)
        chunked_logprob._addmm_fp32(trls, a, weight[:])
        product(ours, a, weight[:])
        cast = torch.ones(40, 64)
        product(cast, a, weight.clone())  # a tensor of its own, as a cast for the call: not kept
        assert torch.equal(cast, ours)
        bf16_error = ((a @ weight).double() + 1 - exact).abs().max()
        assert (ours.double() - 1 - exact).abs().max() < 1e-3 * bf16_error
        assert (ours - trls).abs().max() < 1e-6 * exact.abs().max()  # float32's rounding, summed otherwise
        weight.mul_(-2)


def test_trls_chunked_lm_head_runs_through_the_lean_folds() -> None:
    """The gradient of TRL's chunked log-probabilities (bf16, vocabulary chunks of 256, the log-probabilities'
    gradient only, as GRPO's loss takes it) goes through the replacements and comes out as TRL's own, but
    for float32 sums in another order rounded to bf16."""
    from trl.kernels import ChunkedLogProbFunction, chunked_logprob

    generator = torch.Generator().manual_seed(6)
    hidden = torch.randn(50, 64, generator=generator).bfloat16().requires_grad_()
    weight = torch.randn(1000, 64, generator=generator).bfloat16()
    targets = torch.randint(0, 1000, (50,), generator=generator)
    upstream = torch.randn(50, generator=generator)

    def gradient() -> torch.Tensor:
        hidden.grad = None
        logps, *_ = ChunkedLogProbFunction.apply(
            hidden, weight, None, targets, 0.9, 256, None, 1.0, ("entropy",)
        )
        (logps * upstream).sum().backward()
        return hidden.grad

    trls_functions = (
        chunked_logprob._forward_tile,
        chunked_logprob._backward_tile,
        chunked_logprob._addmm_fp32,
    )
    trls = gradient()
    with cpu_training.lean_lm_head():
        statistics = chunked_logprob._forward_tile
        tile, product = chunked_logprob._backward_tile, chunked_logprob._addmm_fp32
        with (
            mock.patch.object(chunked_logprob, "_forward_tile", wraps=statistics) as folds,
            mock.patch.object(chunked_logprob, "_backward_tile", wraps=tile) as tiles,
            mock.patch.object(chunked_logprob, "_addmm_fp32", wraps=product) as products,
        ):
            ours = gradient()
    assert not {statistics, tile, product} & set(trls_functions)
    assert folds.call_count == tiles.call_count == products.call_count == 4  # 1000 columns in chunks of 256
    assert ((ours.float() - trls.float()).abs() <= trls.float().abs() / 128).all()  # a bf16 step at most
    put_back = (chunked_logprob._forward_tile, chunked_logprob._backward_tile, chunked_logprob._addmm_fp32)
    assert put_back == trls_functions


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


def one_lora_layer(dtype: torch.dtype, dropout: float = 0.0):
    """A PEFT LoRA on one Linear (16 -> 24, r 4) whose B is not zero, as after some training."""
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(16, 24)).to(dtype)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=["0"]))
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "lora_B" in name:
                weight.normal_(0, 0.5)
    return model


def output_and_gradients(model, x: torch.Tensor, lean: bool, autocast: bool = False) -> list[torch.Tensor]:
    """The LoRA layer's output for `x` and the gradients of its input and of A and B, with PEFT's forward or
    lean_lora's, under bf16 autocast or not; whether lean_lora's addmm ran is checked by the caller."""
    model.zero_grad()
    x = x.clone().requires_grad_()
    with (
        cpu_training.lean_lora() if lean else contextlib.nullcontext(),
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast),
    ):
        out = model(x)
    out.float().square().sum().backward()
    lora = [w.grad for name, w in model.named_parameters() if "lora_" in name]
    return [out.detach(), x.grad, *lora]


def test_the_lean_lora_forward_computes_peft_s_output_and_gradients() -> None:
    """In float32, the lean forward's one addmm gives PEFT's output and gradients within float32 rounding;
    in bf16 under autocast (the update's arithmetic) within a bf16 step of the largest value, the sum
    rounded once where PEFT rounds the product, its scaling and the sum."""
    x = torch.randn(3, 5, 16)
    model = one_lora_layer(torch.float32)
    with mock.patch.object(torch, "addmm", wraps=torch.addmm) as addmm:
        lean = output_and_gradients(model, x, lean=True)
    assert addmm.call_count == 1
    for got, want in zip(lean, output_and_gradients(model, x, lean=False), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)

    model = one_lora_layer(torch.bfloat16)
    lean = output_and_gradients(model, x.bfloat16(), lean=True, autocast=True)
    peft = output_and_gradients(model, x.bfloat16(), lean=False, autocast=True)
    assert lean[0].dtype == peft[0].dtype == torch.bfloat16
    for got, want in zip(lean, peft, strict=True):  # a bf16 step of the largest value (sums cancel)
        torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=2**-7 * want.float().abs().max())


def test_the_lean_lora_forward_leaves_what_it_does_not_take_to_peft() -> None:
    """Adapters switched off give the base layer's output; a hook on B still runs (PEFT's forward calls B);
    dropout in training still drops (two forwards differ) and in eval mode is the identity."""
    x = torch.randn(4, 16)
    model = one_lora_layer(torch.float32, dropout=0.5)
    base_layer = model.base_model.model[0].base_layer
    with cpu_training.lean_lora(), torch.no_grad():
        with model.disable_adapter():
            assert torch.equal(model(x), base_layer(x))
        calls: list[int] = []
        hook = model.base_model.model[0].lora_B["default"].register_forward_hook(lambda *_: calls.append(1))
        model(x)
        hook.remove()
        assert calls == [1]
        model.train()
        assert not torch.equal(model(x), model(x))
        model.eval()
        lean = model(x)
    with torch.no_grad():
        torch.testing.assert_close(lean, model(x), rtol=1e-5, atol=1e-6)


def test_sampling_through_the_lean_lora_gives_the_same_tokens(tiny_model: Path) -> None:
    """fast_sampling's lean LoRA forward on a PEFT model of the tiny Qwen2 whose LoRA is not zero: greedy
    decoding gives the tokens and scores of PEFT's own forward (float32), every LoRA layer of every decoding
    step through one addmm."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules=SEVEN, task_type="CAUSAL_LM")
    model = get_peft_model(base, config).eval()
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "lora_B" in name:
                weight.normal_(0, 0.05)
    ids, mask = prompt_batch(tokenizer, load_problems(str(BUNDLED_PROBLEMS))[:3])
    generation = GenerationConfig(
        max_new_tokens=12, do_sample=False, output_scores=True, return_dict_in_generate=True
    )
    plain = model.generate(input_ids=ids, attention_mask=mask, generation_config=generation)
    with (
        cpu_training.fast_sampling(model),
        mock.patch.object(torch, "addmm", wraps=torch.addmm) as addmm,
    ):
        fast = model.generate(input_ids=ids, attention_mask=mask, generation_config=generation)
    assert addmm.call_count >= 7 * base.config.num_hidden_layers * 12
    assert torch.equal(fast.sequences, plain.sequences)
    torch.testing.assert_close(torch.stack(fast.scores), torch.stack(plain.scores), rtol=1e-4, atol=1e-4)


def test_packed_query_heads_give_the_copied_heads_outputs_and_gradients(tiny_model: Path) -> None:
    """packed_gqa on the tiny Qwen2 (4 query heads on 2 key/value heads), float32, left-padded prompts (a
    mask, several queries): the logits and the gradients of every weight are transformers' own, each layer's
    SDPA call on 2 heads of 4 x the queries; without a mask (one length) transformers' own call; the
    attention function is transformers' again on exit."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    ids, mask = prompt_batch(tokenizer, load_problems(str(BUNDLED_PROBLEMS))[:3])
    assert not mask.all()
    layers, width = model.config.num_hidden_layers, ids.shape[1]
    dim = model.config.hidden_size // model.config.num_attention_heads

    def logits_and_gradients(**inputs):
        model.zero_grad()
        logits = model(**inputs).logits
        logits.pow(2).mean().backward()
        return [logits.detach()] + [p.grad.clone() for p in model.parameters()]

    def sdpa_shapes(**inputs):
        sdpa = torch.nn.functional.scaled_dot_product_attention
        with mock.patch.object(torch.nn.functional, "scaled_dot_product_attention", wraps=sdpa) as spy:
            out = logits_and_gradients(**inputs)
        return out, [(tuple(c.args[0].shape), tuple(c.args[1].shape)) for c in spy.call_args_list]

    original = ALL_ATTENTION_FUNCTIONS["sdpa"]
    own = logits_and_gradients(input_ids=ids, attention_mask=mask)
    with cpu_training.packed_gqa():
        packed, shapes = sdpa_shapes(input_ids=ids, attention_mask=mask)
        _, unmasked = sdpa_shapes(input_ids=ids[:1, -8:])
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is original
    assert shapes == [((3, 2, 2 * width, dim), (3, 2, width, dim))] * layers
    assert unmasked == [((1, 4, 8, dim), (1, 2, 8, dim))] * layers  # enable_gqa, transformers' choice
    for got, want in zip(packed, own, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
