"""Shared test set-up. Nothing is skipped silently: without OCaml the whole run fails and says why; tests
marked `gpu` run where torch sees CUDA and are listed as skipped, with one reason line, elsewhere.

Helpers that two test files need live here too (the compile that fails on any device, the small held-out
set, a train.py subprocess, the preflight's lines)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GPU_SKIP_REASON = "needs CUDA: torch sees no GPU (the gpu layer runs on a GPU box: docs/troubleshooting.md)"
REAL_MODEL_SKIP_REASON = "needs the real Qwen2.5-Coder-0.5B: run `make real-model` (README.md, real models)"
# What the real-model tests measured (stage shares, prompt lengths), printed after the run's summary.
REAL_MODEL_FIGURES: list[str] = []
# hygiene: every test fails that leaves a signal disposition, an environment variable, a child process or a
# listening socket behind; pytester runs a pytest session inside a test (tests/test_hygiene.py).
pytest_plugins = ("hygiene", "pytester")


def pytest_sessionstart(session: pytest.Session) -> None:
    missing = [tool for tool in ("ocamlc", "ocamlfind") if shutil.which(tool) is None]
    if missing:
        pytest.exit(
            f"OCaml toolchain missing ({', '.join(missing)} not on PATH): run `make install`",
            returncode=1,
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The `gpu` layer is skipped, with one reason, where torch sees no CUDA device; torch is asked only when
    such a test was collected. The `real_model` tier is skipped, with one reason, where make real-model has
    not converted the 0.5B."""
    if not real_model_folder().is_dir():
        for item in items:
            if item.get_closest_marker("real_model"):
                item.add_marker(pytest.mark.skip(reason=REAL_MODEL_SKIP_REASON))
    gpu_tests = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_tests:
        return
    import torch

    if torch.cuda.is_available():
        return
    for item in gpu_tests:
        item.add_marker(pytest.mark.skip(reason=GPU_SKIP_REASON))


def pytest_terminal_summary(terminalreporter) -> None:
    if REAL_MODEL_FIGURES:
        terminalreporter.section("real model (Qwen2.5-Coder-0.5B-Instruct, Q4_K_M weights)")
        for line in REAL_MODEL_FIGURES:
            terminalreporter.write_line(line)


def real_model_folder() -> Path:
    """Where make real-model converts the 0.5B."""
    from real_model import MODELS

    return MODELS["0.5b"].folder


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's tiny Qwen2 model and tokenizer, built once and shared by every test that trains."""
    from demo import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def one_torch_thread():
    """As the demo does: the tiny model gains nothing from more threads, and they contend with the suite."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def fresh_dynamo():
    """dynamo's caches emptied, so that a test sees its own compilations."""
    import torch

    torch._dynamo.reset()
    yield


# ------------------------------------------------------------------------------------------------------------
# A compile that fails on any device


COMPILE_ERROR = "Cannot find a working triton installation"


def no_triton(graph, example_inputs):
    """A torch.compile backend that fails as inductor does on a box without triton or a C compiler."""
    raise RuntimeError(f"{COMPILE_ERROR}\nmore detail")


@pytest.fixture
def failing_compile(monkeypatch):
    """Every compile the compiled sampler asks for fails, on the CPU and on CUDA alike: the sampler takes its
    compile settings for every device from generation.compile_config, which names the failing backend here.
    Everything else the sampler does (the static cache, the model state, the fallback) stays as it is."""
    from transformers import CompileConfig

    import generation

    def failing_backend(device) -> CompileConfig:
        config = CompileConfig(backend=no_triton, mode=None)
        config._compile_all_devices = True  # transformers' switch for compiling on the CPU
        return config

    monkeypatch.setattr(generation, "compile_config", failing_backend)


# ------------------------------------------------------------------------------------------------------------
# Runs


def small_held_out_set(path: Path) -> Path:
    """Three held-out problems (fewer than a round's four completions) and one whose prompt is over
    GRPO_MAX_PROMPT: shapes that compiled a second graph before."""
    from problems import HELDOUT_PROBLEMS

    rows = [json.loads(line) for line in HELDOUT_PROBLEMS.read_text(encoding="utf-8").splitlines()[:4]]
    rows[3]["prompt"] = rows[3]["prompt"].replace("(**", "(** " + "Take care. " * 400, 1)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def user_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment less the project's settings (a shell's .envrc must not change a test's
    run), plus `env`. PYTHONPATH is kept: on a box whose packages come from it, a child needs it too."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GRPO_", "LORA_", "TRAINING_", "SFT_"))}
    return {**clean, **(env or {})}


def run_train_py(args: list[str], env: dict[str, str] | None = None, timeout: float = 60):
    """train.py as a user runs it, with only the given settings in the environment."""
    return subprocess.run(
        [sys.executable, "train.py", *args],
        cwd=ROOT,
        env=user_environment(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


STATUSES = ("ok    ", "FAIL  ", "skip  ")


def check_lines(out: str) -> dict[str, str]:
    """{check name: its line} of a `train.py --check` report, after asserting every line's form."""
    *lines, verdict = out.strip().splitlines()
    assert all(line.startswith(STATUSES) for line in lines), out
    assert re.match(r"(all checks passed|\d check\(s\) failed) in \d+ s$", verdict), out
    return {line[6:].split(":")[0]: line for line in lines}


def compiled_run_flags(tiny_model: Path, out: Path, held_out: Path, checkpointing: str) -> list[str]:
    """train.py's flags for three steps of the tiny model with the compiled sampler and a held-out evaluation
    at steps 0, 2 and 3 on `held_out` (small_held_out_set)."""
    from problems import BUNDLED_PROBLEMS

    return [
        *("--model-id", str(tiny_model), "--training-dataset", str(BUNDLED_PROBLEMS)),
        *("--output-dir", str(out), "--max-steps", "3", "--save-steps", "5"),
        *("--batch-size", "2", "--num-generations", "2", "--max-completion", "12"),
        *("--lora-r", "4", "--lora-alpha", "8"),
        *("--eval-dataset", str(held_out), "--eval-holdout", "0"),
        *("--eval-steps", "2", "--eval-samples", "1"),
        *("--generation", "compiled", "--gradient-checkpointing", checkpointing, "--report-to", "none"),
    ]


def compile_notes(log: list[str]) -> list[str]:
    """learning.log's lines about a compile of the sampler: its note after the first, a WARNING for any
    later one."""
    return [line for line in log if "compiled:" in line or "recompiled" in line]


# ------------------------------------------------------------------------------------------------------------
# The sampler against the trainer's forward

# Max |sampler - trainer| per-token log-probability. Measured on the 2-core development machine: 1e-6 in
# float32, 2.2e-3 in bf16 (bf16 base weights; the sampler's bf16 copy of the LoRA against the trainer's
# forward, which runs under bf16 autocast where the CPU has bf16 kernels, as on a GPU, and multiplies the
# float32 LoRA elsewhere: cpu_training.bf16_autocast). The LoRA given an effect moves them by 0.39.
LOGPROB_TOLERANCE = {"float32": 1e-4, "bf16": 0.03}
SEVEN = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@contextlib.contextmanager
def first_layer_shapes(model):
    """While open, the (rows, positions) of every input the PEFT model's first decoder layer gets, appended
    to the list it yields: what a forward ran the model on."""
    shapes: list[tuple[int, int]] = []

    def record(_, args, kwargs) -> None:
        shapes.append(tuple((args[0] if args else kwargs["hidden_states"]).shape[:2]))

    watch = model.get_base_model().model.layers[0].register_forward_pre_hook(record, with_kwargs=True)
    try:
        yield shapes
    finally:
        watch.remove()


def bf16_peft(tiny_model: Path, device: str = "cpu"):
    """The tiny model in bf16 on `device`, with an (untrained) LoRA r 8 on all seven projections."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16).to(device)
    return get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=SEVEN, task_type="CAUSAL_LM"))


def solution_batch(tokenizer, device, tokens: int = 40):
    """(prompt ids, attention mask, completion ids) on `device`: two bundled problems' prompts as TRL batches
    them (of different lengths, left-padded) and the first `tokens` tokens of their reference solutions."""
    import torch

    from bench.train_step import prompt_batch
    from problems import BUNDLED_PROBLEMS, load_problems

    problems = load_problems(str(BUNDLED_PROBLEMS))[:2]
    ids, mask = prompt_batch(tokenizer, problems)
    completion = torch.tensor([tokenizer(p["solution"])["input_ids"][:tokens] for p in problems])
    return ids.to(device), mask.to(device), completion.to(device)


@pytest.fixture
def run_python() -> Callable[..., subprocess.CompletedProcess]:
    """`python ARGS...` as a user runs it, from the repository root, its output captured as text."""

    def run(*args: str, timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )

    return run


# ------------------------------------------------------------------------------------------------------------
# Reports


def code_blocks(markdown: str) -> list[str]:
    """The fenced code blocks of a markdown text as CommonMark closes them: a block that opens with N
    backticks ends at the first line of N or more backticks and nothing else."""
    blocks, fence, body = [], None, []
    for line in markdown.splitlines():
        if fence is None:
            opened = re.match(r"^(`{3,})[^`]*$", line)
            fence, body = (opened.group(1), []) if opened else (None, [])
        elif set(line.strip()) == {"`"} and len(line.strip()) >= len(fence):
            blocks.append("\n".join(body))
            fence = None
        else:
            body.append(line)
    assert fence is None, "a code block is left open"
    return blocks
