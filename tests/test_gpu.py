"""The GPU layer: what only a CUDA box can show, on the paths the CPU tests take (train.main, the compiled
sampler, `train.py --check`), where the CPU has dynamo's eager backend and these have inductor and CUDA
graphs. Every test is marked `gpu`: tests/conftest.py skips them, with one reason line, where torch sees no
CUDA device. `make test` on a GPU box runs them with the rest, `pytest -m gpu` alone (about two minutes on
an H100, most of it inductor compiling the tiny model); docs/troubleshooting.md says what a failure of each
means."""

from pathlib import Path

import pytest
import torch
from datasets import Dataset
from torch._dynamo.utils import counters
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
from trl import GRPOTrainer

import train
from bench.train_step import give_lora_an_effect, trainer_logprobs
from conftest import (
    COMPILE_ERROR,
    LOGPROB_TOLERANCE,
    bf16_peft,
    check_lines,
    compile_notes,
    compiled_run_flags,
    run_train_py,
    small_held_out_set,
    solution_batch,
)
from envflags import ConfigError
from generation import CompiledSampler
from problems import BUNDLED_PROBLEMS
from settings import round_rows

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_dynamo")]

COMPILED_NOTE = "# sampling compiled: 1 graph(s) for 4 sequences x 716 cache positions; this call took "
NO_SKIPPED_GRAPH = "; CUDA graphs skipped: 0"


def log_lines(run: Path) -> list[str]:
    return (run / "learning.log").read_text(encoding="utf-8").splitlines()


def test_a_run_compiles_the_sampler_once_across_rounds_evaluations_and_checkpointing(
    tiny_model: Path, tmp_path: Path
) -> None:
    """Three steps with checkpointing on (TRL switches it off around each round and on again for the update,
    an evaluation does not) and held-out evaluations at steps 0, 2 and 3 (3 problems, padded to the round's 4
    rows): one graph in all, its CUDA graph recorded, not skipped, and no WARNING about sampling."""
    graphs, skips = counters["stats"]["unique_graphs"], counters["inductor"]["cudagraph_skips"]
    flags = compiled_run_flags(
        tiny_model, tmp_path / "run", small_held_out_set(tmp_path / "held.jsonl"), "on"
    )
    assert train.main(flags, environ={}) == 0
    log = log_lines(tmp_path / "run")
    assert any(line.startswith("# launch: ") and line.endswith("device: cuda:0") for line in log)
    [note] = compile_notes(log)
    assert note.startswith(COMPILED_NOTE) and note.endswith(NO_SKIPPED_GRAPH), note
    assert not [line for line in log if line.startswith("WARNING sampling")]
    assert counters["stats"]["unique_graphs"] - graphs == 1
    assert counters["inductor"]["cudagraph_skips"] == skips
    assert sum(line.startswith("[Epoch") for line in log) == 3
    assert sum(line.startswith("[Eval") for line in log) == 3


def alternating_reward(completions, **kwargs) -> list[float]:
    """0, 1, 0, 1, ...: each group of two gets one of each, so every completion has an advantage."""
    return [float(i % 2) for i in range(len(completions))]


def test_sampler_logprobs_match_the_trainers_forward_in_bf16_after_an_optimizer_step(
    tiny_model: Path, tmp_path: Path
) -> None:
    """As a run on a bf16 GPU: bf16 weights, float32 LoRA, TRL under bf16 autocast. The sampler is installed
    as train.py installs it and compiles in TRL's round; one optimizer step changes the LoRA in place; then
    the sampler's log-probabilities of two reference solutions are the trainer's forward's, within bf16's
    noise, without a second compile. A sampler that kept the weights from before the step would fail: the
    step moves the log-probabilities by far more than the tolerance."""
    tolerance = LOGPROB_TOLERANCE["bf16"]
    cfg, _ = train.parse_config(
        [
            *("--model-id", str(tiny_model), "--output-dir", str(tmp_path), "--report-to", "none"),
            *("--batch-size", "2", "--num-generations", "2", "--max-completion", "40", "--max-steps", "1"),
            *("--lora-r", "8", "--lora-alpha", "16", "--learning-rate", "5e-2", "--save-steps", "5"),
        ],
        {},
    )
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16),
        reward_funcs=[alternating_reward],
        args=train.grpo_args(cfg, use_bf16=True),  # what train.py passes on a bf16 GPU
        train_dataset=Dataset.from_list([{"prompt": "let f x ="}] * 4),
        processing_class=tokenizer,
        peft_config=train.lora_config(cfg),
    )
    model = trainer.model
    assert model.device.type == "cuda"
    lines: list[str] = []
    sampler = CompiledSampler(cfg.max_prompt_length, round_rows(cfg), log=lines.append)
    sampler.install(model)
    give_lora_an_effect(model, std=0.05)
    ids, mask, completion = solution_batch(tokenizer, model.device)  # 40 tokens: the round's cache length
    before_step = trainer_logprobs(trainer, ids, mask, completion)
    skips = counters["inductor"]["cudagraph_skips"]

    trainer.train()  # one round through the sampler (its compile), then one optimizer step
    sampled = sampler.token_logprobs(model, ids, mask, completion, trainer.generation_config)
    trained = trainer_logprobs(trainer, ids, mask, completion)

    difference = (sampled - trained).abs().max().item()
    step_effect = (trained - before_step).abs().max().item()
    print(f"\nbf16 on CUDA: max |sampler - trainer| {difference:.2e}; the step's effect {step_effect:.2f}")
    assert difference < tolerance
    assert step_effect > 10 * tolerance
    assert [line.split(";")[0] for line in lines] == [
        "compiling the sampler (once per run)...",
        "sampling compiled: 1 graph(s) for 4 sequences x 744 cache positions",
    ]
    assert lines[-1].endswith(NO_SKIPPED_GRAPH) and counters["inductor"]["cudagraph_skips"] == skips


def test_a_failing_compile_falls_back_under_auto_and_stops_under_compiled(
    tiny_model: Path, failing_compile
) -> None:
    model = bf16_peft(tiny_model, "cuda")
    pad = AutoTokenizer.from_pretrained(tiny_model).pad_token_id
    config = GenerationConfig(max_new_tokens=5, do_sample=True, pad_token_id=pad, eos_token_id=None)
    ids = torch.randint(5, 2000, (3, 10), device="cuda")
    mask = torch.ones_like(ids)
    lines: list[str] = []
    CompiledSampler(32, 3, asked="auto", log=lines.append).install(model)
    for _ in range(2):
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        assert out.shape == (3, 15) and out.device.type == "cuda" and torch.equal(out[:, :10], ids)
    assert lines == [
        "compiling the sampler (once per run)...",
        f"sampling: compiled sampler failed (RuntimeError: {COMPILE_ERROR}); sampling with plain from here",
    ]
    with pytest.raises(ConfigError, match=r"^GRPO_GENERATION=compiled: the compiled sampler failed \("):
        CompiledSampler(32, 3, asked="compiled", log=lines.append).generate(model, ids, mask, config)


def test_train_py_check_passes_with_its_gpu_lines_ok(tiny_model: Path, tmp_path: Path) -> None:
    """`python train.py --check` as a user runs it on the GPU box, with the tiny model."""
    flags = ["--model-id", str(tiny_model), "--training-dataset", str(BUNDLED_PROBLEMS)]
    result = run_train_py(["--check", *flags, "--output-dir", str(tmp_path / "out")], timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = check_lines(result.stdout)
    assert all(line.startswith("ok    ") for line in lines.values()), result.stdout
    name = torch.cuda.get_device_name(0)
    assert lines["device"].startswith(f"ok    device: {torch.cuda.device_count()} x {name}, ")
    assert " GiB GPU; " in lines["model"]
    assert lines["model"].endswith("sampling compiled (auto: torch compiles for CUDA here)")
    assert "(inductor)" in lines["sampler"]


def test_a_three_step_train_py_run_compiles_once_and_ends_with_exit_0(
    tiny_model: Path, tmp_path: Path
) -> None:
    """`python train.py` on the demo's tiny model: compiled sampling, gradient checkpointing on, held-out
    evaluation; exit 0 and one compile note."""
    flags = compiled_run_flags(
        tiny_model, tmp_path / "run", small_held_out_set(tmp_path / "held.jsonl"), "on"
    )
    result = run_train_py(flags, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    log = log_lines(tmp_path / "run")
    assert log.count("# compiling the sampler (once per run)...") == 1
    [note] = compile_notes(log)
    assert note.startswith(COMPILED_NOTE) and note.endswith(NO_SKIPPED_GRAPH), note
    assert not [line for line in log if line.startswith("WARNING sampling")]
    assert (tmp_path / "run" / "adapter" / "adapter_model.safetensors").is_file()
