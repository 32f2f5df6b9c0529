"""train.py end to end with the tiny local model: the demo, resume and merge, two processes."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from train import BUNDLED_PROBLEMS, ROOT, main

STEP_LINE = re.compile(
    r"^\[Epoch \d+\.\d\d\]  loss=-?\d+\.\d{4} *  grad=\d+\.\d{4}  lr=\d\.\d\de[-+]\d\d  "
    r"reward=\d\.\d{3}±\d\.\d{3}  syntax_rew=\d\.\d{3}±\d\.\d{3}  entropy=\d+\.\d{3}  frac_zero_std=\d\.\d\d$"
)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """As the demo does: the tiny model gains nothing from more threads, and they contend with the suite."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def step_lines(log: Path) -> list[str]:
    return [line for line in log.read_text(encoding="utf-8").splitlines() if line.startswith("[Epoch")]


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def quick_settings(tiny_model: Path, out: Path, steps: int) -> list[str]:
    """Two prompts x two generations per round: the smallest run that still makes groups."""
    return [
        *("--model-id", str(tiny_model), "--training-dataset", str(BUNDLED_PROBLEMS)),
        *("--output-dir", str(out)),
        *("--batch-size", "2", "--num-generations", "2", "--max-completion", "12", "--max-steps", str(steps)),
        *("--save-steps", "2", "--lora-r", "4", "--lora-alpha", "8"),
    ]


def test_demo_writes_every_output_in_the_seeds_formats(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GRPO_", "LORA_", "TRAINING_"))}
    result = subprocess.run(
        [sys.executable, "train.py", "--demo", "--output-dir", str(out)],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"Outputs in {out.resolve()}/" in result.stdout

    log = (out / "learning.log").read_text(encoding="utf-8")
    assert log.startswith("# ") and "#   num_generations = 6  (demo)" in log
    lines = step_lines(out / "learning.log")
    assert len(lines) == 20
    assert all(STEP_LINE.match(line) for line in lines), lines[:3]
    # The run-health monitor is wired in: a random model's groups all tie, and it says so.
    assert re.search(r"^WARNING \[Epoch [\d.]+\] frac_zero_std=1 ", log, re.M)

    metrics = jsonl(out / "metrics.jsonl")
    steps = [m for m in metrics if "loss" in m]
    assert [m["step"] for m in steps] == list(range(1, 21))
    # Every optimizer step samples its own round of 4 prompts x 6 completions, so every step has rewards.
    for key in (
        "reward",
        "rewards/syntax_aware_reward/mean",
        "frac_reward_zero_std",
        "completions/clipped_ratio",
    ):
        assert all(key in m for m in steps), key
    assert "train_runtime" in metrics[-1]

    completions = jsonl(out / "reward_logs" / "completions.jsonl")
    breakdown = jsonl(out / "reward_logs" / "syntax_aware_breakdown.jsonl")
    assert len(completions) == len(breakdown) == 20 * 24
    assert {"problem_id", "reward", "completion"} <= set(completions[0])
    assert {"problem_id", "total_reward", "stage"} <= set(breakdown[0])

    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-10", "checkpoint-20"]
    assert (out / "adapter" / "adapter_config.json").is_file()
    assert (out / "adapter" / "adapter_model.safetensors").is_file()


def test_resume_appends_to_the_log_and_merge_writes_a_full_model(
    tiny_model: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "run"
    assert main(quick_settings(tiny_model, out, steps=2), environ={}) == 0
    first_part = (out / "learning.log").read_text(encoding="utf-8")
    assert len(step_lines(out / "learning.log")) == 2
    assert (out / "checkpoint-2").is_dir()
    capsys.readouterr()
    assert main(quick_settings(tiny_model, out, steps=4), environ={}) == 2  # forgot --resume: refused
    assert capsys.readouterr().err.startswith(f"error: GRPO_OUTPUT_DIR={str(out)!r} holds checkpoint-2 of")
    assert (out / "learning.log").read_text(encoding="utf-8") == first_part

    merged = tmp_path / "merged"
    argv = [*quick_settings(tiny_model, out, steps=4), "--resume", "--merge-to", str(merged)]
    assert main(argv, environ={}) == 0
    log = (out / "learning.log").read_text(encoding="utf-8")
    assert log.startswith(first_part)
    resumed = log[len(first_part) :]
    assert resumed.startswith("# ") and "train.py resumed from checkpoint-2" in resumed.splitlines()[0]
    assert len(step_lines(out / "learning.log")) == 4
    assert [m["step"] for m in jsonl(out / "metrics.jsonl") if "loss" in m] == [1, 2, 3, 4]
    assert (out / "checkpoint-4").is_dir()

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(merged)
    assert not any("lora" in name for name, _ in model.named_parameters())
    assert model.config.hidden_size == AutoModelForCausalLM.from_pretrained(tiny_model).config.hidden_size


def test_two_processes_under_accelerate_launch(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "ddp"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GRPO_", "LORA_", "TRAINING_"))}
    # `--cpu` alone makes accelerate start one process; this is its distributed launcher on CPU devices.
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    launch += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    result = subprocess.run(
        [*launch, "train.py", *quick_settings(tiny_model, out, steps=2)],
        cwd=ROOT,
        env={**clean, "ACCELERATE_USE_CPU": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    log = (out / "learning.log").read_text(encoding="utf-8")
    assert log.count("train.py started") == 1  # only the main process writes the log
    lines = step_lines(out / "learning.log")
    assert len(lines) == 2 and all(STEP_LINE.match(line) for line in lines)
    # Per step: 2 processes x 2 prompts x 2 completions, each process scoring its own; 2 steps.
    assert len(jsonl(out / "reward_logs" / "completions.jsonl")) == 16
    assert "distributed type: MULTI_CPU" in log and "processes: 2" in log
    assert (out / "adapter" / "adapter_config.json").is_file()


def test_stop_on_red_flags_ends_the_run_with_a_checkpoint(tiny_model: Path, tmp_path: Path) -> None:
    # Four problems make an epoch of 4 steps, so the seed's epoch-1.0 stop criteria are judged early;
    # a random model earns nothing, which is a red flag.
    rows = [json.loads(line) for line in BUNDLED_PROBLEMS.read_text().splitlines()[:4]]
    small = tmp_path / "four.jsonl"
    small.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "stopped"
    argv = [*quick_settings(tiny_model, out, steps=40), "--training-dataset", str(small)]
    assert main([*argv, "--num-epochs", "20", "--save-steps", "100", "--stop-on-red-flags", "1"], {}) == 0
    log = (out / "learning.log").read_text(encoding="utf-8")
    assert re.search(r"^WARNING \[Epoch [\d.]+\] stop criteria hold: ", log, re.M)
    last_step = max(m["step"] for m in jsonl(out / "metrics.jsonl") if "loss" in m)
    assert last_step < 40
    assert (out / f"checkpoint-{last_step}").is_dir()  # saved on the way out, not on the schedule
    assert (out / "adapter" / "adapter_config.json").is_file()
