"""The SFT warm start (`train.py --sft`) on the tiny model, and GRPO continuing its adapter."""

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import train
from problems import BUNDLED_PROBLEMS, load_problems
from prompts import sft_answer
from rewards import score_completion
from train import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def sft_rows(tmp_path: Path) -> Path:
    """Four bundled problems, one with a solution but no tests (SFT needs none) and one without a solution."""
    rows = jsonl(BUNDLED_PROBLEMS)[:4]
    rows.append({**jsonl(BUNDLED_PROBLEMS)[4], "tests": ""})
    rows.append({**jsonl(BUNDLED_PROBLEMS)[5], "solution": ""})
    path = tmp_path / "sft.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_the_loss_is_on_the_answer_in_the_format_the_reward_pays_for(
    tiny_model: Path, tmp_path: Path
) -> None:
    cfg, _ = train.parse_config(
        ["--model-id", str(tiny_model), "--training-dataset", str(sft_rows(tmp_path))], {}
    )
    notes: list[str] = []
    trainer = train.sft_trainer(cfg, notes.append)
    assert "skipped problem max_option: no solution to train on" in notes[0]
    assert len(trainer.train_dataset) == 5  # the row without tests trains too
    problem = load_problems(str(BUNDLED_PROBLEMS))[0]
    row = trainer.train_dataset[0]
    tokenizer = trainer.processing_class
    trained = [t for t, label in zip(row["input_ids"], row["labels"], strict=True) if label != -100]
    prompt = [t for t, label in zip(row["input_ids"], row["labels"], strict=True) if label == -100]
    answer = sft_answer(problem)
    assert tokenizer.decode(trained) == answer + "<|im_end|>\n"
    assert answer.startswith("```ocaml\nlet count_vowels (s : string) : int =\n") and answer.endswith(
        "(* END *)\n```"
    )
    assert tokenizer.decode(prompt).endswith(problem["problem"] + "<|im_end|>\n<|im_start|>assistant\n")
    # The reward gives the answer full marks: SFT teaches exactly what GRPO rewards.
    assert score_completion(problem["problem"], problem["tests"], answer)["total_reward"] == 1.0


def test_sft_then_grpo_continues_its_adapter(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    common = ["--model-id", str(tiny_model), "--output-dir", str(out), "--lora-r", "4", "--lora-alpha", "8"]
    common += ["--report-to", "none"]
    sft = [*common, "--sft", "--training-dataset", str(sft_rows(tmp_path)), "--sft-max-steps", "3"]
    assert main([*sft, "--sft-batch-size", "2", "--sft-learning-rate", "1e-2"], environ={}) == 0

    adapter = out / "sft" / "adapter"
    assert (adapter / "adapter_config.json").is_file()
    log = (out / "sft" / "learning.log").read_text(encoding="utf-8")
    assert log.startswith("# ") and "train.py --sft started" in log.splitlines()[0]
    assert "# skipped problem max_option: no solution to train on" in log
    steps = [line for line in log.splitlines() if line.startswith("[SFT Epoch")]
    assert len(steps) == 3 and all("  loss=" in s and "  token_acc=" in s for s in steps)
    metrics = [m for m in jsonl(out / "sft" / "metrics.jsonl") if "loss" in m]
    assert [m["step"] for m in metrics] == [1, 2, 3] and all("mean_token_accuracy" in m for m in metrics)
    card = (adapter / "README.md").read_text(encoding="utf-8")
    assert f"base_model: {os.path.relpath(tiny_model, out)}" in card and "supervised fine-tuning" in card
    assert str(tmp_path) not in card  # paths relative to the run's folder, none of this machine's
    assert "| `SFT_MAX_STEPS` | `3` | flag |" in card and "PeftModel.from_pretrained" in card
    assert main(sft, environ={}) == 2  # a second --sft would overwrite the first

    grpo = [*common, "--training-dataset", str(BUNDLED_PROBLEMS), "--init-adapter", str(adapter)]
    grpo += ["--batch-size", "2", "--num-generations", "2", "--max-completion", "8", "--max-steps", "1"]
    assert main([*grpo, "--learning-rate", "1e-6", "--eval-steps", "none"], environ={}) == 0
    assert f"# GRPO continues to train the adapter {adapter}" in (out / "learning.log").read_text(
        encoding="utf-8"
    )
    # One step at lr 1e-6 hardly moves the adapter: GRPO started from SFT's weights, not from a fresh
    # adapter (whose B matrices start at zero).
    before, after = (
        load_file(adapter / "adapter_model.safetensors"),
        load_file(out / "adapter" / "adapter_model.safetensors"),
    )
    lora_b = [name for name in before if "lora_B" in name]
    assert lora_b and all(before[name].abs().max() > 1e-3 for name in lora_b)
    assert all(torch.allclose(before[name], after[name], atol=1e-4) for name in lora_b)


def test_grpo_init_adapter_must_be_an_adapter(tmp_path: Path, capsys) -> None:
    assert main(["--print-config", "--init-adapter", str(tmp_path)], environ={}) == 2
    assert capsys.readouterr().err == (
        f"error: GRPO_INIT_ADAPTER={str(tmp_path)!r}: no PEFT adapter (adapter_config.json) there\n"
    )


def test_a_validation_split_chooses_the_epoch_whose_answers_it_predicts_best(
    tiny_model: Path, tmp_path: Path, capfd
) -> None:
    out = tmp_path / "run"
    rows = tmp_path / "sft.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in jsonl(BUNDLED_PROBLEMS)[:6]), encoding="utf-8")
    flags = ["--model-id", str(tiny_model), "--output-dir", str(out), "--sft-all-weights"]
    flags += ["--sft", "--training-dataset", str(rows), "--sft-batch-size", "4", "--sft-num-epochs", "3"]
    # One step an epoch. The first is taken in the warmup; at a learning rate this high the next ones throw
    # the weights off, so the later epochs predict the 3 problems kept out worse: the best is not the last.
    flags += ["--report-to", "none"]  # trackio would set TRACKIO_DIR in this process
    assert main([*flags, "--sft-validation", "3", "--sft-learning-rate", "1.0"], environ={}) == 0

    # piped, as here: the validation's lines, not an evaluation bar's carriage-return frames
    assert "\r" not in "".join(capfd.readouterr())
    log = (out / "sft" / "learning.log").read_text(encoding="utf-8")
    assert "# sft: 3 of 6 problems kept out as the validation split" in log
    validations = [line for line in log.splitlines() if line.startswith("[SFT Validation Epoch")]
    assert len(validations) == 3
    losses = {m["step"]: m["eval_loss"] for m in jsonl(out / "sft" / "metrics.jsonl") if "eval_loss" in m}
    best = min(losses, key=losses.get)
    assert best != max(losses), f"the last epoch was the best ({losses}): the test shows no choice"
    kept = load_file(out / "sft" / "model" / "model.safetensors")
    chosen = load_file(out / "sft" / f"checkpoint-{best}" / "model.safetensors")
    last = load_file(out / "sft" / f"checkpoint-{max(losses)}" / "model.safetensors")
    assert all(torch.equal(kept[name], chosen[name]) for name in kept)
    assert not all(torch.equal(kept[name], last[name]) for name in kept)
