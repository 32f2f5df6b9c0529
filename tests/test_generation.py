"""generation.py on the tiny model: the compiled sampler samples the policy TRL trains (also at the LoRA sizes
of a run's first steps), writes no weight, compiles once per run whatever calls it, falls back to plain or
stops with one line when a compile fails, and runs GRPO; the GRPO_GENERATION and GRPO_GRADIENT_CHECKPOINTING
settings."""

import contextlib
import dataclasses
import importlib.util
import math
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch._dynamo.utils import counters
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    Qwen2Config,
)

import generation
import settings
import train
from bench.sampler_step import device_reads
from bench.train_step import QWEN_CODER_1_5B, give_lora_an_effect, prompt_batch
from conftest import (
    COMPILE_ERROR,
    SEVEN,
    bf16_peft,
    compile_notes,
    compiled_run_flags,
    first_layer_shapes,
    small_held_out_set,
)
from generation import CompiledSampler, gradient_checkpointing, model_update_peak_bytes
from problems import BUNDLED_PROBLEMS, load_problems

pytestmark = pytest.mark.usefixtures("one_torch_thread", "fresh_dynamo")


@pytest.fixture
def bf16_peft_model(tiny_model: Path):
    return bf16_peft(tiny_model)


def base_weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}


def test_sampling_writes_no_weight_and_puts_the_model_back(bf16_peft_model, tiny_model: Path) -> None:
    model = bf16_peft_model
    model.train()
    model.gradient_checkpointing_enable()
    pad = AutoTokenizer.from_pretrained(tiny_model).pad_token_id
    before = base_weights(model)
    hooks = dict(model.get_input_embeddings()._forward_hooks)
    sampler = CompiledSampler(32, log=lambda line: None)
    config = GenerationConfig(max_new_tokens=8, do_sample=True, pad_token_id=pad)
    ids = torch.randint(5, 2000, (3, 12))
    for round_ in range(3):
        give_lora_an_effect(model, std=0.05, seed=round_)  # as the optimizer changes it between rounds
        sampler.generate(model, ids, torch.ones_like(ids), config)
    after = base_weights(model)
    assert all(torch.equal(before[n], after[n]) for n in before)  # the LoRA is unmerged: nothing to restore
    assert model.training and model.is_gradient_checkpointing
    assert dict(model.get_input_embeddings()._forward_hooks) == hooks


# The LoRA delta of 20 Adam steps at lr 5e-6 at Qwen2.5-Coder-1.5B's width (r 32, alpha 64, every lora_B
# entry moved 5e-6 a step; lora_A as PEFT draws it for 1,536 inputs): std 2 x 20 x 5e-6 x sqrt(32) x
# 0.0147 = 1.7e-5, under half a bf16 step (6e-5) of a weight of size 0.02.
FIRST_STEPS_DELTA = 1.7e-5


def lora_of_delta_std(model, std: float) -> None:
    """lora_B entries of one size and random signs, scaled so the deltas have about `std`."""
    generator = torch.Generator().manual_seed(1)
    layers = [m for m in model.modules() if hasattr(m, "get_delta_weight") and hasattr(m, "base_layer")]
    with torch.no_grad():
        for layer in layers:
            weight = layer.lora_B["default"].weight
            weight.copy_(torch.randint(0, 2, weight.shape, generator=generator) * 2.0 - 1)
            weight.mul_(std / layer.get_delta_weight("default").std())


def test_sampler_is_exact_at_the_lora_sizes_of_the_first_steps(tiny_model: Path) -> None:
    """After 20 Adam steps at lr 5e-6 the LoRA's deltas are below half a bf16 step of most weights. In float32
    arithmetic over bf16 weight values the only rounding left is a fold's, so the sampler must reproduce the
    trainer's forward to float32 noise; folding the deltas into the bf16 weights (the sampler's old way,
    bench/sampler_exactness.py) loses 29% of the LoRA's effect on these prompts (63% at the real model's
    width)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16).float()  # bf16 values
    torch.manual_seed(0)  # lora_A's draw
    lora = LoraConfig(r=32, lora_alpha=64, lora_dropout=0.0, target_modules=SEVEN, task_type="CAUSAL_LM")
    model = get_peft_model(model, lora).eval()
    lora_of_delta_std(model, FIRST_STEPS_DELTA)
    ids, mask = prompt_batch(tokenizer, load_problems(str(BUNDLED_PROBLEMS))[:2])
    completion = torch.randint(5, 2000, (2, 24), generator=torch.Generator().manual_seed(0))
    config = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, pad_token_id=tokenizer.pad_token_id)
    sampler = CompiledSampler(64, log=lambda line: None)

    def forward() -> torch.Tensor:
        with torch.no_grad():
            full = torch.cat([ids, completion], 1)
            logits = model(
                input_ids=full, attention_mask=torch.cat([mask, torch.ones_like(completion)], 1)
            ).logits
        return logits[:, ids.shape[1] - 1 : -1].log_softmax(-1).gather(2, completion.unsqueeze(2)).squeeze(2)

    trained, sampled = forward(), sampler.token_logprobs(model, ids, mask, completion, config)
    with model.disable_adapter():
        base = forward()
    # The LoRA does change the policy, by far more than float32's rounding (about 1e-7 here).
    assert (trained - base).abs().mean().item() > 1e-5

    def lost(logprobs: torch.Tensor) -> float:  # the share of the LoRA's effect a sampler leaves out
        effect = (trained - base).flatten()
        return 1 - float((logprobs - base).flatten() @ effect / (effect @ effect))

    print(f"\nshare of the LoRA's effect lost: sampler {lost(sampled):.1e}", end="")
    assert abs(lost(sampled)) < 0.01
    # What a fold would sample: the deltas rounded into the bf16 weights.
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer"):
                weight = module.base_layer.weight
                weight.copy_((weight + module.get_delta_weight("default")).to(torch.bfloat16))
    with model.disable_adapter():
        folded = forward()
    print(f", fold {lost(folded):.2f}")
    assert lost(folded) > 0.2  # 20x the sampler's bound: what the fold loses is no rounding noise


def test_plain_sampling_runs_each_distinct_prompt_once_and_samples_the_same_policy(tiny_model: Path) -> None:
    """A round of 2 prompts x 4 completions, as TRL asks for it: the prompts but their last tokens go through
    the model once, 2 rows; every decoding step after that runs the 8 rows one token at a time; and the
    log-probabilities of forced completions are those of sampling without the shared prompts (float32
    arithmetic, a LoRA with an effect), and differ between the rows' completions."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16).float()
    torch.manual_seed(0)
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules=SEVEN, task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    give_lora_an_effect(model, std=0.05)
    problems = load_problems(str(BUNDLED_PROBLEMS))[:2]
    ids, mask = prompt_batch(tokenizer, [p for p in problems for _ in range(4)])
    completion = torch.randint(5, 2000, (8, 12), generator=torch.Generator().manual_seed(0))
    config = GenerationConfig(do_sample=True, temperature=0.9, top_k=0, pad_token_id=tokenizer.pad_token_id)
    with first_layer_shapes(model) as shapes:
        shared = generation.PlainSampler().token_logprobs(model, ids, mask, completion, config)
    assert shapes == [(2, ids.shape[1] - 1)] + [(8, 1)] * completion.shape[1]

    def plain(*args, **kwargs):
        return generation.plain_generate(model, *args, **kwargs)

    alone = generation.forced_logprobs(plain, ids, mask, completion, config)
    assert (shared - alone).abs().max().item() < 1e-5
    assert (shared[0] - shared[1]).abs().max().item() > 1e-3  # rows of one prompt, their own completions
    assert model.training  # put back as it was


class EndFromStep(LogitsProcessor):
    """Only the end token is possible from completion step `step` on: every sequence ends there."""

    def __init__(self, end: int, prompt_length: int, step: int) -> None:
        self.end, self.at = end, prompt_length + step

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[1] < self.at:
            return scores
        return torch.full_like(scores, -math.inf).index_fill_(1, torch.tensor([self.end]), 0.0)


def test_the_loop_looks_for_the_end_every_few_steps_and_pads_after_it(
    bf16_peft_model, tiny_model: Path
) -> None:
    """transformers' loop reads from the device after every decoding step whether all sequences have ended;
    the sampler's looks every END_CHECK_STEPS steps. Sequences that all end at step 3 come back with the
    same tokens as the loop's own stop gives, then padding up to the next look."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    end, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    ids = torch.randint(5, 2000, (3, 12), generator=torch.Generator().manual_seed(0))
    config = GenerationConfig(max_new_tokens=32, do_sample=True, pad_token_id=pad, eos_token_id=end)
    sampler = CompiledSampler(32, log=lambda line: None)

    def sample() -> torch.Tensor:
        torch.manual_seed(0)
        ending = LogitsProcessorList([EndFromStep(end, ids.shape[1], step=3)])
        return sampler.generate(bf16_peft_model, ids, torch.ones_like(ids), config, logits_processor=ending)

    looked_every_few, reads = sample(), device_reads()
    with reads as count:
        sample()
    with mock.patch.object(generation, "ends_checked_every", lambda steps, length: contextlib.nullcontext()):
        looked_every_step = sample()
        with device_reads() as count_every_step:
            sample()
    assert looked_every_step.shape == (3, 12 + 4)  # three sampled tokens and the end token
    assert looked_every_few.shape == (3, 12 + generation.END_CHECK_STEPS)
    assert torch.equal(looked_every_few[:, : 12 + 4], looked_every_step)
    assert (looked_every_few[:, 12 + 4 :] == pad).all()
    assert count_every_step[0] - count[0] == 4 - 1  # one look instead of four
    assert sampler.compiles == 1


def test_any_prompt_length_and_a_short_batch_share_one_compile(bf16_peft_model, tiny_model: Path) -> None:
    model = bf16_peft_model
    pad = AutoTokenizer.from_pretrained(tiny_model).pad_token_id
    lines: list[str] = []
    sampler = CompiledSampler(48, 3, log=lines.append)
    config = GenerationConfig(max_new_tokens=6, do_sample=True, pad_token_id=pad, eos_token_id=None)
    for batch, length in [(3, 9), (3, 20), (3, 41), (2, 17), (1, 30), (3, 48)]:
        ids = torch.randint(5, 2000, (batch, length))
        mask = torch.ones_like(ids)
        mask[0, : length // 3] = 0  # left padding, as TRL's
        out = sampler.generate(model, ids, mask, config)
        # TRL's layout: the prompt as given, then the completion, so its prompt-length slicing holds.
        assert out.shape == (batch, length + 6)
        assert torch.equal(out[:, :length], ids)
    # One graph (no graph break) for prompts from 9 to 48 tokens and for batches short of a round (padded).
    # The WARNING of a slow round is left out: it reads the box's load, not the compiles (a busy CI box once
    # had these 6 ms decoding steps at 2.1x).
    assert [line.split(";")[0] for line in lines if "per decoding step" not in line] == [
        "compiling the sampler (once per run)...",
        "sampling compiled: 1 graph(s) for 3 sequences x 54 cache positions",
    ]
    # The cache stays at the same addresses, so a recorded CUDA graph can be replayed.
    keys = sampler.caches[(3, 54)].layers[0].keys.data_ptr()
    sampler.generate(model, torch.randint(5, 2000, (3, 25)), torch.ones(3, 25, dtype=torch.long), config)
    assert sampler.caches[(3, 54)].layers[0].keys.data_ptr() == keys
    # Any later compile is a WARNING.
    torch._dynamo.reset()
    sampler.generate(model, ids, mask, config)
    assert lines[-1].startswith("WARNING sampling recompiled (2 compiles this run; TORCH_LOGS=recompiles")


def test_a_failing_compile_under_auto_samples_plain_from_then_on(
    bf16_peft_model, tiny_model: Path, failing_compile
) -> None:
    model = bf16_peft_model
    model.train()
    pad = AutoTokenizer.from_pretrained(tiny_model).pad_token_id
    lines: list[str] = []
    sampler = CompiledSampler(32, 3, asked="auto", log=lines.append)
    sampler.install(model)
    config = GenerationConfig(max_new_tokens=5, do_sample=True, pad_token_id=pad, eos_token_id=None)
    before = base_weights(model)
    for _ in range(2):
        ids = torch.randint(5, 2000, (3, 10))
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
        assert out.shape == (3, 15) and torch.equal(out[:, :10], ids)
    assert lines == [
        "compiling the sampler (once per run)...",
        f"sampling: compiled sampler failed (RuntimeError: {COMPILE_ERROR}); sampling with plain from here",
    ]
    assert model.training and all(torch.equal(before[n], p) for n, p in base_weights(model).items())


def test_a_run_on_auto_goes_on_with_plain_when_the_compile_fails(
    tiny_model: Path, tmp_path: Path, failing_compile, monkeypatch
) -> None:
    monkeypatch.setattr(settings, "torch_cuda_missing", lambda: None)  # auto picks compiled, as on a GPU box
    flags = [
        *("--model-id", str(tiny_model), "--training-dataset", str(BUNDLED_PROBLEMS), "--output-dir"),
        *(str(tmp_path), "--max-steps", "2", "--batch-size", "2", "--num-generations", "2"),
        *("--max-completion", "8", "--eval-steps", "none", "--report-to", "none"),
    ]
    assert train.main(flags, environ={}) == 0
    log = (tmp_path / "learning.log").read_text(encoding="utf-8").splitlines()
    assert "#   generation = compiled  (auto)" in log
    failed = [line for line in log if "compiled sampler failed" in line]
    assert failed == [
        f"# sampling: compiled sampler failed (RuntimeError: {COMPILE_ERROR}); sampling with plain from here"
    ]
    assert sum(line.startswith("[Epoch") for line in log) == 2
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()


def test_a_failing_compile_asked_for_stops_the_run_with_one_line(
    tiny_model: Path, tmp_path: Path, failing_compile, capsys
) -> None:
    flags = [
        *("--model-id", str(tiny_model), "--training-dataset", str(BUNDLED_PROBLEMS)),
        *("--output-dir", str(tmp_path), "--max-steps", "2", "--batch-size", "2", "--num-generations", "2"),
        *("--max-completion", "8", "--generation", "compiled", "--eval-steps", "none", "--report-to", "none"),
    ]
    assert train.main(flags, environ={}) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    # A line of its own: the run closes its progress bar before the error is printed.
    assert err.splitlines()[-1] == (
        "error: GRPO_GENERATION=compiled: the compiled sampler failed (RuntimeError: Cannot find a working "
        "triton installation); set GRPO_GENERATION=plain to sample without it"
    )
    assert not list(tmp_path.glob("checkpoint-*"))


def test_a_round_twice_as_slow_per_step_is_a_warning() -> None:
    lines: list[str] = []
    sampler = CompiledSampler(32, log=lines.append)
    for seconds in [1.0, 1.1, 0.9, 1.0, 1.5, 2.2, 2.4]:  # 100 decoding steps each
        sampler.note_round(seconds, 100)
    assert lines == [
        "WARNING sampling: 22.0 ms per decoding step, 2.2x the 10.0 ms of the first rounds after the compile "
        "(CUDA graphs re-recorded? TORCH_LOGS=cudagraphs says)"
    ]


@pytest.mark.parametrize("checkpointing", ["on", "off"])
def test_a_run_with_held_out_evaluation_compiles_once(
    tiny_model: Path, tmp_path: Path, checkpointing: str
) -> None:
    graphs = counters["stats"]["unique_graphs"]
    held_out = small_held_out_set(tmp_path / "held.jsonl")
    flags = compiled_run_flags(tiny_model, tmp_path / "run", held_out, checkpointing)
    assert train.main(flags, environ={}) == 0
    log = (tmp_path / "run" / "learning.log").read_text(encoding="utf-8").splitlines()
    assert (
        f"# sampling: compiled; gradient checkpointing: {checkpointing} (as set); "
        "update: passes of 2 completions" in log
    )
    assert any(
        line.startswith("# dataset: 3 problems from the held-out set; 1 dropped as longer") for line in log
    )
    # Three steps and three evaluations (steps 0, 2, 3), one compile: 4 sequences (2 prompts x 2; the
    # evaluation's 3 padded to 4) and a cache of 704 + 12 positions. Neither TRL's toggling of checkpointing
    # around its rounds nor the evaluation's own calls make it compile again.
    assert log.index("# compiling the sampler (once per run)...") < min(
        i for i, line in enumerate(log) if line.startswith("[Eval")
    )
    compiles = compile_notes(log)
    assert len(compiles) == 1 and "compiled: 1 graph(s) for 4 sequences x 716 cache positions" in compiles[0]
    assert counters["stats"]["unique_graphs"] - graphs == 1
    assert sum(line.startswith("[Epoch") for line in log) == 3
    assert sum(line.startswith("[Eval") for line in log) == 3
    assert (tmp_path / "run" / "adapter" / "adapter_model.safetensors").is_file()


def test_auto_is_compiled_only_where_torch_can_compile_for_cuda(monkeypatch) -> None:
    """Each answer of the device probes, whatever this box has: settings asks libcuda first (no torch import
    where it shows no GPU), then torch, then whether triton is installed."""
    assert [settings.generation_choice(c, {})[0] for c in ("plain", "compiled", "vllm")] == [
        "plain",
        "compiled",
        "vllm",
    ]
    monkeypatch.setattr(settings, "_cuda_visible", lambda: False)  # no driver, or no device
    assert settings.generation_choice("auto", {}) == ("plain", "auto: no CUDA device")
    # A driver that shows a GPU to a torch that cannot use it (a CPU-only wheel, a driver too old): plain.
    monkeypatch.setattr(settings, "_cuda_visible", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path, why = settings.generation_choice("auto", {})
    assert path == "plain" and why.startswith(f"auto: the driver shows a GPU but torch {torch.__version__}")
    # torch sees the GPU: compiled where triton, inductor's GPU code generator, is installed.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    find_spec = importlib.util.find_spec
    for triton_found in (False, True):

        def triton_as_set(name: str, *args, found: bool = triton_found):
            return (find_spec("pytest") if found else None) if name == "triton" else find_spec(name, *args)

        monkeypatch.setattr(importlib.util, "find_spec", triton_as_set)
        expected = (
            ("compiled", "auto: torch compiles for CUDA here")
            if triton_found
            else ("plain", "auto: triton (torch.compile's GPU code generator) is not installed")
        )
        assert settings.generation_choice("auto", {}) == expected


REFUSED = [
    ({"TORCHINDUCTOR_FREEZING": "1"}, "TORCHINDUCTOR_FREEZING=1 bakes the first round's weights"),
    ({"ACCELERATE_USE_FSDP": "true"}, "FSDP shards the weights"),
    ({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}, "DeepSpeed ZeRO-3 shards"),
]


@pytest.mark.parametrize(("environ", "reason"), REFUSED, ids=["freezing", "fsdp", "zero3"])
def test_frozen_or_sharded_weights_make_auto_plain_and_stop_compiled(
    monkeypatch, capsys, environ, reason
) -> None:
    monkeypatch.setattr(settings, "torch_cuda_missing", lambda: None)  # as on a CUDA box
    assert settings.generation_choice("auto", {})[0] == "compiled"
    path, why = settings.generation_choice("auto", environ)
    assert path == "plain" and why.startswith(f"auto: {reason}")
    assert train.main(["--print-config", "--generation", "compiled"], environ=environ) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: GRPO_GENERATION=compiled: {reason}")
    assert err[0].endswith("set GRPO_GENERATION=plain")


BAD_VALUES = [
    ("GRPO_USE_VLLM", "1", "replaced by GRPO_GENERATION; write GRPO_GENERATION=vllm to sample with vLLM"),
    ("GRPO_USE_VLLM", "0", "replaced by GRPO_GENERATION; write GRPO_GENERATION=vllm to sample with vLLM"),
    ("GRPO_GENERATION", "fast", "expected one of auto, plain, compiled, vllm"),
    ("GRPO_GRADIENT_CHECKPOINTING", "maybe", "expected one of auto, on, off"),
]


@pytest.mark.parametrize(("name", "raw", "message"), BAD_VALUES, ids=[f"{n}={r}" for n, r, _ in BAD_VALUES])
def test_old_or_bad_setting_stops_with_one_line(name: str, raw: str, message: str, capsys) -> None:
    assert train.main(["--print-config"], environ={name: raw}) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1
    assert err.startswith(f"error: {name}={raw!r}: {message}")


def test_choices_reach_trl() -> None:
    cfg, _ = train.parse_config([], {})
    assert train.grpo_args(cfg, use_bf16=False).use_vllm is False
    assert train.grpo_args(dataclasses.replace(cfg, generation="vllm"), use_bf16=False).use_vllm is True
    for choice, on in [("on", True), ("off", False), ("auto", True)]:  # train() settles auto later
        args = train.grpo_args(dataclasses.replace(cfg, gradient_checkpointing=choice), use_bf16=False)
        assert args.gradient_checkpointing is args.activation_checkpointing is on


def test_auto_checkpointing_follows_the_model_and_the_card(tmp_path: Path, tiny_model: Path) -> None:
    Qwen2Config(**QWEN_CODER_1_5B, dtype="bfloat16").save_pretrained(tmp_path)  # the config, no weights
    seed_pass = 4 * (704 + 512)  # GRPO_BATCH_SIZE x (GRPO_MAX_PROMPT + GRPO_MAX_COMPLETION)
    # The rule reproduces the H100's measured peak without checkpointing (24.7 GiB, issue 11) at the
    # bench's sequences (about 450 + 512 tokens), from above.
    assert 24.7 <= model_update_peak_bytes(str(tmp_path), 4 * (450 + 512)) / 2**30 <= 1.1 * 24.7

    def peak(model: Path) -> Callable[[], int]:
        return lambda: model_update_peak_bytes(str(model), seed_pass)

    assert gradient_checkpointing("auto", peak(tmp_path), 80 * 2**30)[0] is False  # H100 80GB
    assert gradient_checkpointing("auto", peak(tmp_path), 24 * 2**30)[0] is True  # a 24 GB card
    assert gradient_checkpointing("auto", peak(tiny_model), 2**30)[0] is False
    # Set values are taken as they are, without reading the model.
    assert gradient_checkpointing("on", peak(Path("no/such-model")), 2**40) == (True, "as set")
    assert gradient_checkpointing("off", peak(Path("no/such-model")), 2**30) == (False, "as set")


def test_print_config_and_the_header_show_the_resolved_sampler(monkeypatch) -> None:
    def resolved(argv: list[str], environ: dict[str, str]) -> tuple[str, str, str]:
        cfg, sources = train.parse_config(argv, environ)
        return cfg.generation, sources["generation"], sources["generation_reason"]

    monkeypatch.setattr(settings, "torch_cuda_missing", lambda: "no CUDA device")  # as on this box
    assert resolved([], {}) == ("plain", "auto", "auto: no CUDA device")
    monkeypatch.setattr(settings, "torch_cuda_missing", lambda: None)  # as on a CUDA box
    assert resolved([], {}) == ("compiled", "auto", "auto: torch compiles for CUDA here")
    assert resolved([], {"ACCELERATE_USE_FSDP": "1"}) == ("plain", "auto", "auto: FSDP shards the weights")
    assert resolved(["--generation", "plain"], {"GRPO_GENERATION": "compiled"}) == ("plain", "flag", "as set")
