"""The compiled sampler samples what the trainer has now. Dynamo's guards on the model's modules are skipped
(generation.compile_config) and the LoRA is sampled from a copy in the base's dtype (bf16), so both must be
shown fresh: after an optimizer step at a high learning rate the sampler's log-probabilities are the
trainer's forward on the new weights, with no new compile and the copies at their old addresses; and a
module state the skipped guards would have caught (adapters disabled, a weight replaced, another model)
compiles again, with a WARNING that names what changed, never samples through a stale graph. On the CPU on
every box (dynamo's eager backend); tests/test_gpu.py checks the same after a step on CUDA."""

from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOTrainer

import cpu_training
import train
from bench.train_step import give_lora_an_effect, trainer_logprobs
from conftest import LOGPROB_TOLERANCE, solution_batch
from generation import CompiledSampler, PlainSampler

pytestmark = pytest.mark.usefixtures("one_torch_thread", "fresh_dynamo")

TOLERANCE = {torch.float32: LOGPROB_TOLERANCE["float32"], torch.bfloat16: LOGPROB_TOLERANCE["bf16"]}
PROMPT_BUDGET = 64


def zero_reward(completions, **kwargs) -> list[float]:
    return [0.0] * len(completions)


def lora_trainer(tiny_model: Path, output_dir: Path, dtype: torch.dtype) -> GRPOTrainer:
    """TRL's trainer of the tiny model with train.py's LoRA, its LoRA given an effect."""
    cfg, _ = train.parse_config(
        [
            *("--model-id", str(tiny_model), "--output-dir", str(output_dir)),
            *("--lora-r", "8", "--lora-alpha", "16"),
            *("--report-to", "none"),  # no tracker: TRL's profiling would log to one never started
        ],
        {},
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model, dtype=dtype),
        reward_funcs=[zero_reward],
        args=train.grpo_args(cfg, use_bf16=cpu_training.bf16_autocast(dtype)),  # what train.py passes here
        train_dataset=Dataset.from_list([{"prompt": "let f x ="}] * 4),
        processing_class=AutoTokenizer.from_pretrained(tiny_model),
        peft_config=train.lora_config(cfg),
    )
    # On the CPU on any box (the trainer moved it to a GPU where there is one): tests/test_gpu.py checks the
    # sampler after an optimizer step on CUDA.
    trainer.model.to("cpu")
    give_lora_an_effect(trainer.model, std=0.05)
    return trainer


def optimizer_step(trainer: GRPOTrainer, ids: torch.Tensor, mask: torch.Tensor, lr: float) -> None:
    """One AdamW step of the LoRA on the prompts' language-model loss, under the trainer's autocast as its
    forward runs: every LoRA weight moves by about lr."""
    model = trainer.model
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    with trainer.accelerator.autocast():
        loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def max_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bf16"])
def test_after_an_optimizer_step_the_sampler_samples_the_new_weights(
    tiny_model: Path, tmp_path: Path, dtype: torch.dtype
) -> None:
    trainer = lora_trainer(tiny_model, tmp_path, dtype)
    model, config = trainer.model, trainer.generation_config
    ids, mask, completion = solution_batch(trainer.processing_class, trainer.model.device)
    sampler = CompiledSampler(PROMPT_BUDGET, log=lambda line: None)
    before = sampler.token_logprobs(model, ids, mask, completion, config)  # compiles; the copies made
    addresses = {id(weight): copy.data_ptr() for weight, copy in sampler.lora_copies.items()}
    trained_before = trainer_logprobs(trainer, ids, mask, completion)
    with model.disable_adapter():
        base = trainer_logprobs(trainer, ids, mask, completion)
    gap, effect = max_difference(before, trained_before), max_difference(base, trained_before)
    print(f"\n{dtype}: max |sampler - trainer| log-prob {gap:.2e}; the LoRA's effect {effect:.2f}", end="")
    assert gap < TOLERANCE[dtype]
    assert effect > 10 * TOLERANCE[dtype]  # the test would see a sampler that left the LoRA out

    optimizer_step(trainer, ids, mask, lr=1e-2)
    after = sampler.token_logprobs(model, ids, mask, completion, config)
    trained = trainer_logprobs(trainer, ids, mask, completion)

    print(f"; after the step {max_difference(after, trained):.2e}")
    assert max_difference(after, trained) < TOLERANCE[dtype]
    assert max_difference(before, trained) > 10 * TOLERANCE[dtype]  # a stale sampler would fail the above
    assert sampler.compiles == 1  # new weights, same graph: the step reads them on every call
    # bf16 weights get bf16 copies of the float32 LoRA, refreshed where the CUDA graph recorded them.
    lora_weights = [p for name, p in model.named_parameters() if "lora_" in name]
    assert len(addresses) == (len(lora_weights) if dtype == torch.bfloat16 else 0)
    assert {id(weight): copy.data_ptr() for weight, copy in sampler.lora_copies.items()} == addresses
    assert all(weight.dtype == torch.float32 for weight in sampler.lora_copies)  # the trained ones kept


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bf16"])
def test_plain_sampling_on_the_cpu_samples_what_the_trainer_trains(
    tiny_model: Path, tmp_path: Path, dtype: torch.dtype
) -> None:
    """train.py's CPU sampler (the LoRA multiplied in bf16 for bf16 weights, eval mode) against the trainer's
    forward under the run's autocast and the run's CPU kernels (cpu_training.fast_kernels: the LM head on the
    completion positions only, plain attention heads), before and after an optimizer step."""
    trainer = lora_trainer(tiny_model, tmp_path, dtype)
    model, config = trainer.model, trainer.generation_config
    ids, mask, completion = solution_batch(trainer.processing_class, trainer.model.device)
    sampler = PlainSampler()
    with cpu_training.fast_kernels(model, trainer.args.bf16):
        for step in range(2):
            sampled = sampler.token_logprobs(model, ids, mask, completion, config)
            trained = trainer_logprobs(trainer, ids, mask, completion)
            with model.disable_adapter():
                effect = max_difference(trainer_logprobs(trainer, ids, mask, completion), trained)
            gap = max_difference(sampled, trained)
            print(f"\n{dtype}, step {step}: max |sampler - trainer| {gap:.2e}; LoRA's effect {effect:.2f}")
            assert gap < TOLERANCE[dtype]
            assert effect > 10 * TOLERANCE[dtype]
            optimizer_step(trainer, ids, mask, lr=1e-2)
    lora_weights = [p for name, p in model.named_parameters() if "lora_" in name]
    assert len(sampler.lora_copies) == (len(lora_weights) if dtype == torch.bfloat16 else 0)
    assert all(weight.dtype == torch.float32 for weight in sampler.lora_copies)  # the trained ones kept


def test_a_state_the_skipped_guards_would_catch_compiles_again(tiny_model: Path, tmp_path: Path) -> None:
    trainer = lora_trainer(tiny_model, tmp_path / "first", torch.float32)
    model, config = trainer.model, trainer.generation_config
    ids, mask, completion = solution_batch(trainer.processing_class, trainer.model.device)
    lines: list[str] = []
    sampler = CompiledSampler(PROMPT_BUDGET, log=lines.append)

    def sampled_matches_the_forward() -> bool:
        sampled = sampler.token_logprobs(model, ids, mask, completion, config)
        return max_difference(sampled, trainer_logprobs(trainer, ids, mask, completion)) < 1e-4

    assert sampled_matches_the_forward()
    with_lora = trainer_logprobs(trainer, ids, mask, completion)
    with model.disable_adapter():
        assert sampled_matches_the_forward()
        assert max_difference(trainer_logprobs(trainer, ids, mask, completion), with_lora) > 0.1
    assert "the model's state changed since the last compile" in lines[-1]
    assert "_disable_adapters" in lines[-1] and lines[-1].startswith("WARNING sampling recompiled")
    assert sampled_matches_the_forward()  # the adapters on again

    # A LoRA weight replaced by a new tensor, as loading an adapter's weights into the model can.
    layer = model.base_model.model.model.layers[0].self_attn.q_proj.lora_B["default"]
    layer.weight = torch.nn.Parameter(layer.weight.detach() + 0.5)
    assert sampled_matches_the_forward()
    assert "q_proj.lora_B.default: _parameters" in lines[-1]
    assert sampler.compiles == 4  # the first, adapters off, on again, the new weight

    # Another model in the same process: the graph compiled for the first one is not reused.
    other = lora_trainer(tiny_model, tmp_path / "second", torch.float32)
    give_lora_an_effect(other.model, std=0.05, seed=1)
    second = CompiledSampler(PROMPT_BUDGET, log=lines.append)
    sampled = second.token_logprobs(other.model, ids, mask, completion, config)
    assert max_difference(sampled, trainer_logprobs(other, ids, mask, completion)) < 1e-4
    assert max_difference(sampled, with_lora) > 0.1
    # And back: the first sampler's model, unchanged, compiles again over the second's graph.
    assert sampled_matches_the_forward()
    assert "another model was compiled since this sampler's last compile" in lines[-1]
