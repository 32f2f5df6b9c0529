"""grouped_lora.py on the tiny Qwen2 with a LoRA that is not zero: sampling through the groups of one input
gives PEFT's own tokens and scores with 4 linear products a decoder layer (and 7 addmm) where the lean
forward makes 14, whichever layer of a group is called first; other calls go to the layer's own forward; a
model moved to another dtype is grouped again."""

from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

import grouped_lora
from bench.train_step import give_lora_an_effect, prompt_batch
from conftest import SEVEN
from generation import PlainSampler
from problems import BUNDLED_PROBLEMS, load_problems

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def lora_model(tiny_model: Path):
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules=SEVEN, task_type="CAUSAL_LM")
    model = get_peft_model(base, config)
    give_lora_an_effect(model, std=0.05)
    return model


def greedy(model, ids, mask, sample) -> tuple[torch.Tensor, torch.Tensor]:
    config = GenerationConfig(
        max_new_tokens=10, do_sample=False, output_scores=True, return_dict_in_generate=True
    )
    out = sample(model, ids, mask, config)
    return out.sequences, torch.stack(out.scores)


def peft_generate(model, ids, mask, config):
    model.eval()
    return model.generate(input_ids=ids, attention_mask=mask, generation_config=config)


def attention(model):
    return model.get_base_model().model.layers[0].self_attn


def test_sampling_through_the_groups_gives_peft_s_tokens_in_fewer_products(tiny_model: Path) -> None:
    model = lora_model(tiny_model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    ids, mask = prompt_batch(tokenizer, load_problems(str(BUNDLED_PROBLEMS))[:3])
    want_tokens, want_scores = greedy(model, ids, mask, peft_generate)
    forwards: list[int] = []
    model.get_base_model().register_forward_pre_hook(lambda *_: forwards.append(1))
    sampler = PlainSampler()
    with mock.patch.object(F, "linear", wraps=F.linear) as linear:
        tokens, scores = greedy(model, ids, mask, sampler.generate)
    assert torch.equal(tokens, want_tokens)
    torch.testing.assert_close(scores, want_scores, rtol=1e-4, atol=1e-4)
    layers = model.config.num_hidden_layers
    assert linear.call_count == len(forwards) * (4 * layers + 1)  # q-k-v, o, gate-up, down; the LM head
    # The stacked base weights are the model's own: one storage for q, k and v, and no copy of them.
    q, k, v = (attention(model).q_proj, attention(model).k_proj, attention(model).v_proj)
    storages = {layer.base_layer.weight.untyped_storage().data_ptr() for layer in (q, k, v)}
    assert len(storages) == 1
    assert "forward" not in vars(q)  # the layers' own forward again after sampling


def test_any_layer_of_a_group_may_come_first_and_other_calls_go_to_the_layer(tiny_model: Path) -> None:
    model = lora_model(tiny_model).eval()
    attn = attention(model)
    x = torch.randn(2, 5, model.config.hidden_size)
    with torch.no_grad():
        want = [attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)]
        with grouped_lora.grouped_lora(model, {}):
            with mock.patch.object(F, "linear", wraps=F.linear) as linear:
                got = {"v": attn.v_proj(x), "q": attn.q_proj(x), "k": attn.k_proj(x)}
            assert linear.call_count == 1
            other = torch.randn_like(x)  # another input: the group runs again
            torch.testing.assert_close(attn.k_proj(other), type(attn.k_proj).forward(attn.k_proj, other))
    for name, output in zip("qkv", want, strict=True):
        torch.testing.assert_close(got[name], output, rtol=1e-5, atol=1e-6)
    with grouped_lora.grouped_lora(model, {}):
        trained = attn.q_proj(x)  # with gradients: PEFT's own forward, which the update differentiates
        assert trained.grad_fn is not None
        model.train()
        with torch.no_grad():
            assert not torch.equal(attn.q_proj(x), attn.q_proj(x))  # LoRA dropout still drops in training


def test_a_hooked_layer_runs_alone_and_its_siblings_are_not_grouped(tiny_model: Path) -> None:
    model = lora_model(tiny_model)
    attn = attention(model)
    calls: list[int] = []
    attn.k_proj.lora_A["default"].register_forward_hook(lambda *_: calls.append(1))
    groups = grouped_lora.shared_input_groups(model)
    assert all(attn.k_proj not in group for group in groups)
    assert (attn.q_proj,) in groups and (attn.v_proj,) in groups
    with grouped_lora.grouped_lora(model, {}), torch.no_grad():
        attn.k_proj(torch.randn(1, model.config.hidden_size))
    assert calls == [1]


def test_a_model_moved_to_another_dtype_is_grouped_again(tiny_model: Path) -> None:
    model = lora_model(tiny_model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    ids, mask = prompt_batch(tokenizer, load_problems(str(BUNDLED_PROBLEMS))[:2])
    sampler = PlainSampler()
    greedy(model, ids, mask, sampler.generate)
    model.double()  # every weight a new tensor: the buffers of the first call no longer hold them
    want_tokens, want_scores = greedy(model, ids, mask, peft_generate)
    tokens, scores = greedy(model, ids, mask, sampler.generate)
    assert torch.equal(tokens, want_tokens)
    torch.testing.assert_close(scores, want_scores, rtol=1e-9, atol=1e-9)
    assert all(buffer.dtype == torch.float64 for buffer in sampler.lora_groups.values())


@pytest.mark.parametrize(
    ("config", "change", "lean"),
    [
        ({}, None, "default"),
        ({"use_dora": True}, None, None),  # a variant: its own terms
        ({"lora_bias": True}, None, None),  # a bias on B
        ({}, lambda layer: layer.merge(), None),
        ({}, lambda layer: layer.enable_adapters(False), None),
        ({}, lambda layer: layer.lora_B["default"].register_forward_pre_hook(lambda *_: None), None),
    ],
)
def test_only_a_plain_unmerged_adapter_is_multiplied_without_peft_s_forward(config, change, lean) -> None:
    """lean_adapter, which both the lean forward and the groups ask: PEFT's own forward for a variant, a bias
    on B, a merged layer, adapters off or a hook on A or B."""
    model = get_peft_model(
        torch.nn.Sequential(torch.nn.Linear(16, 8)), LoraConfig(r=4, target_modules=["0"], **config)
    )
    layer = model.base_model.model[0]
    if change:
        change(layer)
    assert grouped_lora.lean_adapter(layer) == lean
    assert grouped_lora.plain_adapter(layer) == lean
