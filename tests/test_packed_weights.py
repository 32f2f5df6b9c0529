"""packed_weights.py: bf16 products from weights reordered into oneDNN's layout give F.linear's bits, a copy
is made once a scope (a sampler's call, an evaluation) and dropped after it, calls with gradients and float32
weights keep PyTorch's path, and sampling the tiny model in bf16 through PlainSampler gives the same tokens
and scores with the copies as without them."""

from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

import packed_weights
from bench.train_step import give_lora_an_effect, prompt_batch
from conftest import SEVEN
from evaluate import generate_samples
from generation import PlainSampler
from problems import BUNDLED_PROBLEMS, load_problems

pytestmark = [
    pytest.mark.usefixtures("one_torch_thread"),
    pytest.mark.skipif(
        not packed_weights.supported(),
        reason="needs a CPU whose oneDNN multiplies bf16 (AVX-512 BF16 or AMX)",
    ),
]


@pytest.mark.parametrize("rows", [1, 16, 300])
@pytest.mark.parametrize("with_bias", [False, True])
def test_a_product_from_the_copy_is_f_linear_s_bits_and_the_copy_is_made_once(rows, with_bias) -> None:
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(200, 64, generator=generator).bfloat16()
    bias = torch.randn(200, generator=generator).bfloat16() if with_bias else None
    x = torch.randn(rows, 3, 64, generator=generator).bfloat16()[:, -1]  # strided, as a prompt's last rows
    want = F.linear(x, weight, bias)
    with torch.no_grad(), packed_weights.held():
        got = packed_weights.linear(x, weight, bias)
        copy = packed_weights.copies[id(weight)][1]
        assert copy.is_mkldnn
        again = packed_weights.linear(x, weight, bias)
        assert packed_weights.copies[id(weight)][1] is copy
        with packed_weights.held():  # an inner scope is the outer one
            assert packed_weights.copies[id(weight)][1] is copy
        assert packed_weights.copies is not None
    assert packed_weights.copies is None
    assert torch.equal(got, want) and torch.equal(again, want)


def test_gradients_and_float32_keep_pytorch_s_path() -> None:
    weight = torch.randn(32, 16).bfloat16()
    x = torch.randn(4, 16).bfloat16().requires_grad_()
    with packed_weights.held():
        out = packed_weights.linear(x, weight)  # gradient recorded: F.linear, which autograd differentiates
        out.sum().backward()
        assert x.grad is not None and not packed_weights.copies
        with torch.no_grad():
            packed_weights.linear(x.float(), weight.float())
        assert not packed_weights.copies


def bf16_lora_model(tiny_model: Path):
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=SEVEN, task_type="CAUSAL_LM")
    model = get_peft_model(base, config)
    give_lora_an_effect(model, std=0.05)
    return model.eval()


def test_sampling_from_the_copies_gives_the_same_tokens_and_scores(tiny_model: Path) -> None:
    model = bf16_lora_model(tiny_model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    ids, mask = prompt_batch(tokenizer, load_problems(str(BUNDLED_PROBLEMS))[:3])
    config = GenerationConfig(
        max_new_tokens=12, do_sample=False, output_scores=True, return_dict_in_generate=True
    )
    head = model.get_output_embeddings()
    seen: list[int] = []
    head.register_forward_hook(lambda *_: seen.append(len(packed_weights.copies or {})))
    sampler = PlainSampler()
    with mock.patch.object(packed_weights, "supported", lambda: False):
        want = sampler.generate(model, ids, mask, config)
    assert set(seen) == {0}  # switched off: no copy
    seen.clear()
    got = sampler.generate(model, ids, mask, config)
    # Every step multiplied from copies: per decoder layer q-k-v, o, gate-up and down's groups; the LM head.
    assert set(seen) == {4 * model.config.num_hidden_layers + 1}
    assert packed_weights.copies is None and "forward" not in vars(head)
    assert torch.equal(got.sequences, want.sequences)
    assert torch.equal(torch.stack(got.scores), torch.stack(want.scores))


def test_an_evaluation_makes_its_copies_once_for_all_its_generate_calls(tiny_model: Path) -> None:
    # A model without LoRA, as evaluate.py loads a base model: its weights require gradients it never gets.
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16)
    PlainSampler().install(model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    head = model.get_output_embeddings()
    copies: list[int] = []
    head.register_forward_hook(lambda *_: copies.append(id(packed_weights.copies[id(head.weight)][1])))
    problems = load_problems(str(BUNDLED_PROBLEMS))[:3]
    wanted = [(p["id"], 0, p["problem"]) for p in problems]
    sampling = GenerationConfig(max_new_tokens=9, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    generate_samples(
        model, tokenizer, wanted, sampling, lambda ids: {"ids": ids}, batch_size=2, seed=0, chunk=3
    )
    assert len(copies) > 9 and len(set(copies)) == 1  # chunks of 3 tokens, several calls: one copy
    assert packed_weights.copies is None
