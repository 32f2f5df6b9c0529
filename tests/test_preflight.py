"""`python train.py --check` (preflight.py) on this box, CPU or GPU, with the demo's tiny model: the real
toolchain, sandbox, reward, datasets, tokenizer and sampler; one line per check; a FAIL naming the setting to
change. tests/test_gpu.py runs it as a user does on a GPU box."""

import subprocess
from pathlib import Path
from unittest import mock

import pytest
import torch

import cpu_training
import generation
import preflight
import settings
import train
from conftest import STATUSES, check_lines, run_train_py
from problems import BUNDLED_PROBLEMS, ROOT, load_problems


def device_lines() -> tuple[str, str, str]:
    """What the device, model and sampler lines start with or hold on this box: the GPU checks are `ok` where
    torch sees CUDA (and the sampler compiles with inductor there), `skip` on the CPU."""
    if torch.cuda.is_available():
        return (
            f"ok    device: {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}, ",
            "sampling compiled (auto: torch compiles for CUDA here)",
            "(inductor)",
        )
    # A driver may show a GPU to a torch that cannot use it (a CPU-only wheel): auto says which.
    why = "the driver shows a GPU but torch" if settings._cuda_visible() else "no CUDA device"
    return (
        "skip  device: no CUDA device for torch",
        f"sampling plain (auto: {why}",
        "(dynamo with the eager backend on the CPU)",
    )


@pytest.mark.usefixtures("one_torch_thread")
def test_the_check_passes_on_this_box(tiny_model: Path, tmp_path: Path, capsys) -> None:
    flags = ["--check", "--model-id", str(tiny_model), "--training-dataset", str(BUNDLED_PROBLEMS)]
    assert train.main([*flags, "--output-dir", str(tmp_path / "out")], environ={}) == 0
    lines = check_lines(capsys.readouterr().out)
    assert list(lines) == [
        "toolchain",
        "sandbox",
        "reward",
        "training data",
        "held-out data",
        "device",
        "model",
        "sampler",
        "output",
    ]
    assert lines["toolchain"].startswith("ok    toolchain: ocamlc 4.")
    assert (
        lines["sandbox"] == "ok    sandbox: bubblewrap runs; a write outside the sandbox's folder is refused"
    )
    assert lines["reward"].startswith("ok    reward: the worked example scores 1.0 in the sandbox")
    usable = len(load_problems(str(BUNDLED_PROBLEMS)))
    assert lines["training data"].startswith(
        f"ok    training data: TRAINING_DATASET={BUNDLED_PROBLEMS}: {usable} usable problems; 0 prompts over "
        "GRPO_MAX_PROMPT=704 tokens"
    )
    device, sampling, backend = device_lines()
    assert lines["device"].startswith(device)
    assert sampling in lines["model"]
    assert lines["sampler"].startswith("ok    sampler: compiled against plain on a 2-layer random qwen2")
    assert backend in lines["sampler"]
    assert lines["output"] == f"ok    output: {tmp_path / 'out'}: writable, no earlier run's checkpoints"


@pytest.mark.usefixtures("one_torch_thread")
def test_an_unusable_dataset_and_an_earlier_run_fail_naming_what_to_change(
    tiny_model: Path, tmp_path: Path, capsys
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"id": "a", "prompt": "no signature here", "tests": "let () = ()"}\n'
        '{"id": "b", "prompt": "(** x *)\\nlet f (x : int) : int =", "tests": ""}\n',
        encoding="utf-8",
    )
    (tmp_path / "out" / "checkpoint-3").mkdir(parents=True)
    flags = ["--check", "--model-id", str(tiny_model), "--training-dataset", str(bad), "--eval-steps", "none"]
    assert train.main([*flags, "--output-dir", str(tmp_path / "out")], environ={}) == 1
    lines = check_lines(capsys.readouterr().out)
    assert lines["training data"].startswith(
        f"FAIL  training data: TRAINING_DATASET={str(bad)!r}: no usable problem (2 rows dropped"
    )
    assert lines["output"].startswith(
        f"FAIL  output: GRPO_OUTPUT_DIR={str(tmp_path / 'out')!r} holds checkpoint-3 of an earlier run: pass "
        "--resume"
    )
    assert "held-out data" not in lines  # no held-out evaluation in this run
    assert lines["toolchain"].startswith("ok")


def test_make_check_runs_it() -> None:
    make = subprocess.run(["make", "-n", "check"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert ".venv/bin/python train.py --check" in make.stdout.splitlines()


def test_the_model_line_estimates_the_seed_model_from_its_config_alone(tmp_path: Path) -> None:
    from transformers import Qwen2Config

    from bench.train_step import QWEN_CODER_1_5B
    from settings import TrainConfig

    Qwen2Config(**QWEN_CODER_1_5B, dtype="bfloat16").save_pretrained(tmp_path)  # the config, no weights
    cfg = TrainConfig(model_id=str(tmp_path), generation="plain")
    with mock.patch.object(cpu_training, "on_cpu", lambda: False):  # as on the seed's GPU box
        line = preflight.check_model(cfg, {"generation": "flag", "generation_reason": "as set"})
    # 1.54B parameters in bf16; one round's static cache at the seed's shapes: 24 x (704 + 512) positions.
    assert line.startswith(
        f"{tmp_path}: 1.54B parameters, 2.9 GiB of weights; estimated peak 3.7 GiB sampling"
    )
    # At the budgets (704 + 512 tokens); the H100 measured 24.7 and 8.5 GiB at the bench's 450 + 512.
    assert "update 29.9 GiB without gradient checkpointing and 9.4 GiB with it" in line
    assert line.endswith("update passes of 4 completions; sampling plain (as set)")


def test_the_model_line_estimates_a_pass_of_a_whole_group_on_the_cpu(tmp_path: Path) -> None:
    """2 prompts x 8 completions on a CPU with 64 GiB: a pass of a group, its prompt once, 704 + 8 x 256
    positions, where TRL's passes of 2 hold 2 x (704 + 256)."""
    from transformers import Qwen2Config

    from bench.train_step import QWEN_CODER_1_5B
    from settings import TrainConfig

    if not cpu_training.on_cpu():
        pytest.skip("a pass of a whole group is the CPU's; a GPU box keeps TRL's passes")
    Qwen2Config(**QWEN_CODER_1_5B, dtype="bfloat16").save_pretrained(tmp_path)
    shape = {"per_device_train_batch_size": 2, "num_generations": 8, "max_completion_length": 256}
    cfg = TrainConfig(model_id=str(tmp_path), generation="plain", **shape)
    with mock.patch.object(generation, "device_memory", lambda device: 64 * 2**30):
        line = preflight.check_model(cfg, {"generation": "flag", "generation_reason": "as set"})
    trl_passes = generation.model_update_peak_bytes(str(tmp_path), 2 * (704 + 256))
    group_pass = generation.model_update_peak_bytes(str(tmp_path), 704 + 8 * 256)
    assert f"update {preflight.gib(group_pass)} GiB without gradient checkpointing" in line
    assert group_pass > trl_passes
    assert "checkpointing off (auto: estimated peak without it" in line
    assert line.endswith("update passes of 8 completions (a group each); sampling plain (as set)")


def test_an_unreadable_model_config_fails_once_and_skips_the_sampler(tmp_path: Path, capsys) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{not json", encoding="utf-8")
    flags = ["--check", "--model-id", str(model), "--training-dataset", str(BUNDLED_PROBLEMS)]
    assert (
        train.main([*flags, "--output-dir", str(tmp_path / "out"), "--eval-steps", "none"], environ={}) == 1
    )
    out = capsys.readouterr().out
    *lines, verdict = out.strip().splitlines()
    assert all(line.startswith(STATUSES) for line in lines), out  # nothing but the checks' own lines
    assert verdict.startswith("2 check(s) failed"), out  # the tokenizer and the model, from one cause
    by_name = {line[6:].split(":")[0]: line for line in lines}
    assert by_name["model"].startswith(f"FAIL  model: GRPO_MODEL_ID={str(model)!r}: cannot load its config (")
    assert (
        by_name["sampler"]
        == "skip  sampler: needs the model's config (the model line says why it cannot be read)"
    )


def test_offline_the_hub_lines_name_the_offline_route(tmp_path: Path) -> None:
    """A new user's first `make check` on a box without the hub (HF_HUB_OFFLINE here, an empty cache): the
    tokenizer, training data and model lines say the hub cannot be reached and name the way forward, in one
    line each, instead of the libraries' connection errors."""
    import hub
    from real_model import MODELS

    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "GRPO_OUTPUT_DIR": str(tmp_path / "out")}
    done = run_train_py(["--check", "--eval-steps", "none"], env=env, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = check_lines(done.stdout)
    model = f"GRPO_MODEL_ID={settings.TrainConfig().model_id!r}"
    unreachable = "the Hugging Face hub cannot be reached and it is not cached; offline, "
    assert lines["tokenizer"] == f"FAIL  tokenizer: {model}: cannot load its tokenizer: {unreachable}" + (
        f"`make real-model` builds the real Qwen2.5-Coder-0.5B: GRPO_MODEL_ID={hub.REAL_MODEL_FOLDER}"
    )
    assert lines["model"] == lines["tokenizer"].replace("tokenizer", "model", 1).replace(
        "its tokenizer", "its config"
    )
    data = f"TRAINING_DATASET={settings.TrainConfig().training_dataset!r}"
    assert lines["training data"] == (
        f"FAIL  training data: {data}: cannot load it: {unreachable}the bundled problems: "
        "TRAINING_DATASET=data/problems.jsonl"
    )
    assert str(MODELS["0.5b"].folder.relative_to(ROOT)) == hub.REAL_MODEL_FOLDER
    assert (ROOT / "data" / "problems.jsonl").is_file()
    assert "https://" not in done.stdout
