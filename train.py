"""GRPO + LoRA training of a causal LM on OCaml problems, rewarded by the real OCaml toolchain.

    python train.py                      # GRPO; settings from flags > env (.envrc) > defaults
    python train.py --sft                # the supervised warm start on reference solutions
    python train.py --print-config       # the resolved settings as JSON, nothing loaded
    python train.py --demo               # tiny local model, SFT then GRPO on the CPU, about 90 s

TRL's GRPOTrainer does the sampling, advantages and updates (its SFTTrainer the warm start); PEFT adds the
LoRA adapter; `rewards.py` scores every completion with the OCaml compiler. This file resolves the
settings, builds the dataset and prompt, evaluates on held-out problems during training, and writes the logs
the seed analysis reads: learning.log (one line per logging step), metrics.jsonl, and the model card.
Torch, transformers, TRL and PEFT are imported only after every setting has been checked, so a bad value
stops in well under a second and never after the model has loaded.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import importlib.util
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import config
from config import ConfigError, setting
from ocaml_sandbox import ToolchainMissing, check_toolchain
from rewards import (
    END_MARKER,
    STAGES,
    RewardConfig,
    SyntaxAwareReward,
    own_definition,
    parse_problem,
    problem_and_tests,
    score_completion,
    unescape_line_breaks,
)

ROOT = Path(__file__).resolve().parent
BUNDLED_PROBLEMS = ROOT / "data" / "problems.jsonl"
DEMO_PROBLEMS = ROOT / "data" / "demo_problems.jsonl"
DEMO_SFT = ROOT / "data" / "demo_sft.jsonl"
HELDOUT_PROBLEMS = ROOT / "data" / "heldout.jsonl"
README = ROOT / "README.md"

LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")
TRACKER_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}


def _tracker_installed(name: str) -> str | None:
    if name != "none" and importlib.util.find_spec(TRACKER_PACKAGES[name]) is None:
        return f"the {name} package is not installed (pip install {TRACKER_PACKAGES[name]}), or use none"
    return None


def _vllm_installed(choice: str) -> str | None:
    if choice == "vllm" and importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed: pip install -r requirements-gpu.txt on the GPU box"
    return None


def _cuda_visible() -> bool:
    """Whether the CUDA driver shows a device (CUDA_VISIBLE_DEVICES honoured), asked through libcuda
    rather than torch so that settings resolve without importing torch."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    count = ctypes.c_int(0)
    return driver.cuInit(0) == 0 and driver.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0


def generation_path(choice: str) -> str:
    """GRPO_GENERATION resolved: `auto` is the compiled sampler where CUDA is, TRL's plain sampling elsewhere
    (vLLM is never picked for you: it is a separate install, and it takes GPU memory or a second GPU)."""
    if choice != "auto":
        return choice
    return "compiled" if _cuda_visible() else "plain"


def _module_names(value: str) -> str | None:
    if not all(name.strip() for name in value.split(",")):
        return "expected comma-separated module names such as q_proj,v_proj"
    return None


@dataclass
class TrainConfig(RewardConfig):
    """Every setting of a run: the reward's (inherited) and the trainer's, named as in TRL."""

    model_id: str = setting(
        "Qwen/Qwen2.5-Coder-1.5B-Instruct", "GRPO_MODEL_ID", "hub id or local directory of the model to train"
    )
    training_dataset: str = setting(
        "kiranpg/ocaml-training-problems",
        "TRAINING_DATASET",
        "hub id, or a local JSONL/CSV/parquet file or folder with id, prompt (or problem), tests",
    )
    output_dir: str = setting(
        "grpo_runs", "GRPO_OUTPUT_DIR", "learning.log, metrics.jsonl, reward_logs/, checkpoints, adapter"
    )
    per_device_train_batch_size: int = setting(
        4, "GRPO_BATCH_SIZE", "prompts per device per step; also completions per forward/backward pass", low=1
    )
    gradient_accumulation_steps: int = setting(
        1, "GRPO_GRAD_ACCUM_STEPS", "multiplies the prompts of one optimizer step", low=1
    )
    num_generations: int = setting(
        6, "GRPO_NUM_GENERATIONS", "completions sampled per prompt (the group)", low=2
    )
    max_prompt_length: int = setting(
        704, "GRPO_MAX_PROMPT", "prompt tokens after the chat template; longer problems are dropped", low=1
    )
    max_completion_length: int = setting(
        512, "GRPO_MAX_COMPLETION", "completion tokens sampled at most", low=1
    )
    num_train_epochs: float = setting(
        1.0, "GRPO_NUM_EPOCHS", "passes over the dataset", low=0, strict_low=True
    )
    max_steps: int | None = setting(None, "GRPO_MAX_STEPS", "stop after this many optimizer steps", low=1)
    learning_rate: float = setting(5e-6, "GRPO_LEARNING_RATE", "peak learning rate", low=0, strict_low=True)
    temperature: float = setting(0.9, "GRPO_TEMPERATURE", "sampling temperature", low=0, strict_low=True)
    max_grad_norm: float = setting(
        1.0, "GRPO_MAX_GRAD_NORM", "gradient clipping norm", low=0, strict_low=True
    )
    logging_steps: int = setting(1, "GRPO_LOGGING_STEPS", "optimizer steps per learning.log line", low=1)
    save_steps: int = setting(100, "GRPO_SAVE_STEPS", "optimizer steps between checkpoints", low=1)
    save_total_limit: int | None = setting(
        3, "GRPO_SAVE_TOTAL_LIMIT", "checkpoints kept (oldest deleted)", low=1
    )
    beta: float = setting(0.0, "GRPO_BETA", "KL penalty weight; 0 loads no reference model", low=0)
    loss_type: str = setting("dapo", "GRPO_LOSS_TYPE", "TRL loss formulation", choices=LOSS_TYPES)
    epsilon_high: float | None = setting(
        None,
        "GRPO_EPSILON_HIGH",
        "upper clip bound (clip-higher, e.g. 0.28); none = 0.2",
        low=0,
        strict_low=True,
    )
    mask_truncated_completions: bool = setting(
        False, "GRPO_MASK_TRUNCATED_COMPLETIONS", "leave completions cut at the length limit out of the loss"
    )
    top_entropy_quantile: float = setting(
        1.0,
        "GRPO_TOP_ENTROPY_QUANTILE",
        "train only on this share of tokens, highest entropy first (1 = all)",
        low=0,
        strict_low=True,
        high=1,
    )
    scale_rewards: str = setting(
        "group",
        "GRPO_SCALE_REWARDS",
        "divide advantages by the reward std of",
        choices=("group", "batch", "none"),
    )
    report_to: str = setting(
        "none",
        "GRPO_REPORT_TO",
        "experiment tracker",
        choices=tuple(["none", *TRACKER_PACKAGES]),
        check=_tracker_installed,
    )
    generation: str = setting(
        "auto",
        "GRPO_GENERATION",
        "how completions are sampled: plain (TRL's), compiled (LoRA folded in, static cache, compiled "
        "step; README Speed), vllm (requirements-gpu.txt); auto: compiled on CUDA, plain elsewhere",
        choices=("auto", "plain", "compiled", "vllm"),
        check=_vllm_installed,
    )
    vllm_mode: str = setting(
        "colocate",
        "GRPO_VLLM_MODE",
        "vLLM in the training process or a `trl vllm-serve` server",
        choices=("colocate", "server"),
    )
    gradient_checkpointing: str = setting(
        "auto",
        "GRPO_GRADIENT_CHECKPOINTING",
        "recompute activations in the backward pass: less memory, slower update; auto: off where the "
        "estimated peak without it fits the device",
        choices=("auto", "on", "off"),
    )
    stop_on_red_flags: bool = setting(
        False, "GRPO_STOP_ON_RED_FLAGS", "stop (checkpoint saved) when the seed's stop criteria hold"
    )
    lora_r: int = setting(32, "LORA_R", "LoRA rank", low=1)
    lora_alpha: int = setting(64, "LORA_ALPHA", "LoRA scaling numerator", low=1)
    lora_dropout: float = setting(0.05, "LORA_DROPOUT", "dropout on the LoRA input", low=0, high=1)
    lora_bias: str = setting("none", "LORA_BIAS", "which biases train", choices=("none", "all", "lora_only"))
    lora_target_modules: str = setting(
        "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
        "LORA_TARGET_MODULES",
        "comma-separated modules that get an adapter",
        check=_module_names,
    )
    few_shot: int = setting(
        1,
        "GRPO_FEW_SHOT",
        "worked examples before the problem in the prompt (0 or 1); 0 suits a model warm-started by "
        "--sft and shortens every prompt",
        low=0,
        check=lambda n: (
            None if n <= len(FEW_SHOT) else f"expected at most {len(FEW_SHOT)} (the examples there are)"
        ),
    )
    seed: int = setting(
        42, "GRPO_SEED", "random seed of initialisation, data order and sampling (GRPO and SFT)"
    )
    init_adapter: str | None = setting(
        None,
        "GRPO_INIT_ADAPTER",
        "LoRA adapter folder GRPO continues to train, e.g. an --sft run's GRPO_OUTPUT_DIR/sft/adapter; "
        "none = a fresh adapter",
    )
    sft_dataset: str | None = setting(
        None,
        "SFT_DATASET",
        "--sft: problems with a reference `solution` (hub id or local file, as TRAINING_DATASET); "
        "none = TRAINING_DATASET",
    )
    sft_num_epochs: float = setting(
        1.0, "SFT_NUM_EPOCHS", "--sft: passes over the dataset", low=0, strict_low=True
    )
    sft_max_steps: int | None = setting(
        None, "SFT_MAX_STEPS", "--sft: stop after this many optimizer steps", low=1
    )
    sft_learning_rate: float = setting(
        2e-4,
        "SFT_LEARNING_RATE",
        "--sft: peak learning rate (10% warmup, then cosine decay)",
        low=0,
        strict_low=True,
    )
    sft_batch_size: int = setting(4, "SFT_BATCH_SIZE", "--sft: problems per device per optimizer step", low=1)
    sft_all_weights: bool = setting(
        False,
        "SFT_ALL_WEIGHTS",
        "--sft trains every weight and saves a full model instead of a LoRA adapter (for small or "
        "randomly initialised models)",
    )
    eval_dataset: str | None = setting(
        "data/heldout.jsonl",
        "GRPO_EVAL_DATASET",
        "held-out problems scored during training (hub id or local file, as TRAINING_DATASET; the default is "
        "the bundled 48); none = no file",
    )
    eval_holdout: int = setting(
        0,
        "GRPO_EVAL_HOLDOUT",
        "problems of TRAINING_DATASET (picked by GRPO_SEED) kept out of training and evaluated as well",
        low=0,
    )
    eval_steps: int | None = setting(
        100,
        "GRPO_EVAL_STEPS",
        "optimizer steps between held-out evaluations, plus one before the first step and one at the end; "
        "none = no evaluation",
        low=1,
    )
    eval_samples: int = setting(
        1, "GRPO_EVAL_SAMPLES", "completions sampled per held-out problem; pass@1 is their pass rate", low=1
    )


# The demo pins what decides its run time and what it shows, so an .envrc in the shell cannot change it;
# flags still win. A tiny model is built into <output_dir>/tiny-model, warm-started by SFT on every weight
# (data/demo_sft.jsonl: each of the 12 easy problems with its reference answer and a plausible wrong one),
# then trained by GRPO with a LoRA adapter on the same problems, against the real reward.
DEMO_SETTINGS = {
    "GRPO_OUTPUT_DIR": "grpo_runs/demo",
    "TRAINING_DATASET": str(DEMO_PROBLEMS),
    "SFT_DATASET": str(DEMO_SFT),
    "SFT_ALL_WEIGHTS": "1",
    "SFT_MAX_STEPS": "180",
    "SFT_LEARNING_RATE": "3e-3",
    "SFT_BATCH_SIZE": "4",
    "GRPO_FEW_SHOT": "0",
    "MIN_NON_EMPTY_LINES": "2",
    "GRPO_BATCH_SIZE": "4",
    "GRPO_GRAD_ACCUM_STEPS": "1",
    "GRPO_NUM_GENERATIONS": "6",
    "GRPO_MAX_PROMPT": "704",
    "GRPO_MAX_COMPLETION": "48",
    "GRPO_MAX_STEPS": "40",
    "GRPO_LEARNING_RATE": "3e-3",
    "GRPO_TEMPERATURE": "0.5",
    "GRPO_SAVE_STEPS": "20",
    "GRPO_SAVE_TOTAL_LIMIT": "2",
    "GRPO_EVAL_DATASET": str(HELDOUT_PROBLEMS),
    "GRPO_EVAL_HOLDOUT": "0",
    "GRPO_EVAL_STEPS": "20",
    "GRPO_GENERATION": "plain",
    "GRPO_REPORT_TO": "none",
    "LORA_R": "16",
    "LORA_ALPHA": "32",
}
DEMO_MODEL_SHAPE = {"layers": 4, "width": 128}  # SFT takes it from random to the answers in about 30 s


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="GRPO + LoRA training of a code model on OCaml, rewarded by the OCaml toolchain.",
        epilog="Every setting resolves as flag > env variable > default.",
    )
    parser.add_argument(
        "--print-config", action="store_true", help="print the resolved settings as JSON and exit"
    )
    parser.add_argument(
        "--config-table", action="store_true", help="print the README's settings table and exit"
    )
    parser.add_argument(
        "--sft",
        action="store_true",
        help="supervised warm start on the problems' reference solutions (SFT_* settings) instead of GRPO",
    )
    parser.add_argument("--demo", action="store_true", help="offline run of a tiny local model on the CPU")
    parser.add_argument(
        "--resume", action="store_true", help="continue from the latest checkpoint in the output dir"
    )
    parser.add_argument(
        "--merge-to", metavar="DIR", help="after training, write base model + adapter merged to DIR"
    )
    config.add_arguments(parser, TrainConfig)
    return parser


def parse_config(
    argv: list[str] | None = None, environ: Mapping[str, str] | None = None, *, demo: bool = False
) -> tuple[TrainConfig, dict[str, str]]:
    """Settings from flags > env > defaults (the demo's settings stand in for env); raises ConfigError."""
    args, _ = build_parser().parse_known_args(argv)
    environ = dict(os.environ if environ is None else environ)
    if "GRPO_USE_VLLM" in environ:  # an .envrc from before GRPO_GENERATION
        raise ConfigError(
            f"GRPO_USE_VLLM={environ['GRPO_USE_VLLM']!r}: replaced by GRPO_GENERATION; write "
            "GRPO_GENERATION=vllm to sample with vLLM, or remove the line (auto samples without it)"
        )
    if demo:
        environ.update(DEMO_SETTINGS)
    cfg, sources = config.resolve(TrainConfig, args, environ)
    if demo:
        demo_fields = {
            f.name for f in dataclasses.fields(TrainConfig) if f.metadata.get("env") in DEMO_SETTINGS
        }
        sources = {k: "demo" if k in demo_fields and v != "flag" else v for k, v in sources.items()}
        if sources["model_id"] != "flag":  # run_demo builds it there
            cfg = dataclasses.replace(cfg, model_id=str(Path(cfg.output_dir) / "tiny-model"))
            sources["model_id"] = "demo"
    if cfg.generation == "auto":  # resolved here, so that --print-config and learning.log's header show it
        cfg = dataclasses.replace(cfg, generation=generation_path("auto"))
        sources["generation"] = "auto"
    check_paths(cfg, sources)
    return cfg, sources


def check_paths(cfg: TrainConfig, sources: Mapping[str, str]) -> None:
    """Local model and dataset paths must exist; each failure is one line."""
    model_path = Path(cfg.model_id).expanduser()
    model_missing = not (model_path / "config.json").is_file() and sources["model_id"] != "demo"
    if looks_local(cfg.model_id) and model_missing:
        raise ConfigError(f"GRPO_MODEL_ID={cfg.model_id!r}: no model directory (config.json) there")
    datasets = [
        ("TRAINING_DATASET", cfg.training_dataset),
        ("SFT_DATASET", cfg.sft_dataset),
        ("GRPO_EVAL_DATASET", cfg.eval_dataset and bundled_path(cfg.eval_dataset)),
    ]
    for env, name in datasets:
        if name and looks_local(name) and not Path(name).expanduser().exists():
            raise ConfigError(f"{env}={name!r}: no such file or folder")
    if cfg.init_adapter and not (Path(cfg.init_adapter).expanduser() / "adapter_config.json").is_file():
        raise ConfigError(
            f"GRPO_INIT_ADAPTER={cfg.init_adapter!r}: no PEFT adapter (adapter_config.json) there"
        )


def looks_local(name: str) -> bool:
    """A hub id is `owner/name`; anything that exists, or reads like a path or a file name, is local."""
    return (
        Path(name).expanduser().exists()
        or name.startswith((".", "/", "~"))
        or name.count("/") > 1
        or Path(name).suffix in DATASET_BUILDERS
    )


# ------------------------------------------------------------------------------------------------------------
# Data and prompt

DATASET_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def load_problems(
    source: str,
    warn: Callable[[str], None] = print,
    *,
    for_sft: bool = False,
    setting_name: str = "TRAINING_DATASET",
) -> list[dict]:
    """Rows {id, problem, tests, solution, difficulty} from a hub id or a local file or folder; malformed
    rows reported, skipped. `solution` is None and `difficulty` "unknown" where a row has none; `for_sft`
    needs a solution and no tests. Line breaks are read as the scoring CLI reads them (a CSV export's
    `\\n`). An error names `setting_name`, where the source came from."""
    import datasets

    datasets.disable_progress_bars()
    path = Path(source).expanduser()
    try:
        if path.is_file():
            builder = DATASET_BUILDERS.get(path.suffix)
            if builder is None:
                raise ConfigError(
                    f"{setting_name}={source!r}: expected a .jsonl, .json, .csv or .parquet file"
                )
            rows = datasets.load_dataset(builder, data_files=str(path), split="train")
        else:
            rows = datasets.load_dataset(str(path) if path.is_dir() else source, split="train")
    except ConfigError:
        raise
    except Exception as err:  # datasets raises many types; the cause is what the user needs
        cause = err.__cause__ or err
        raise ConfigError(
            f"{setting_name}={source!r}: cannot load it ({type(cause).__name__}: {cause})"
        ) from None

    problems, seen = [], set()
    for index, row in enumerate(rows):
        problem_id = row.get("id") if row.get("id") not in (None, "") else f"row {index}"
        problem_id = str(problem_id)
        try:
            if problem_id in seen:
                raise ValueError("duplicate id")
            problem, tests = problem_and_tests(row, need_tests=not for_sft)
            solution = row.get("solution")
            has_solution = isinstance(solution, str) and bool(solution.strip())
            if for_sft and not has_solution:
                raise ValueError("no solution to train on")
        except ValueError as err:
            warn(f"skipped problem {problem_id}: {err}")
            continue
        seen.add(problem_id)
        problems.append(
            {
                "id": problem_id,
                "problem": problem,
                "tests": tests,
                "solution": unescape_line_breaks(solution) if has_solution else None,
                "difficulty": str(row.get("difficulty") or "unknown"),
            }
        )
    return problems


SYSTEM_PROMPT = (
    "You are an expert OCaml programmer. Complete the function the user gives you. Reply with one "
    "```ocaml code block holding the complete definition, starting with the given signature line, at least "
    "{min_lines} lines of code, without the doc comment or the type definitions. End the block with the line "
    + END_MARKER
    + " and write nothing after it."
)

# Each example is (problem, tests, answer). train.py scores them with the real reward before training:
# an example below full marks would teach the model what the reward punishes. One example keeps the
# prompt well inside the seed's 704 tokens.
FEW_SHOT = [
    (
        "(** Return the values of [t] in order: left subtree, value, right subtree.\n"
        "    >>> to_list (Node (Node (Leaf, 1, Leaf), 2, Node (Leaf, 3, Leaf)))\n"
        "    [1; 2; 3]\n"
        "*)\n"
        "type tree = Leaf | Node of tree * int * tree\n\n"
        "let to_list (t : tree) : int list =",
        "let () =\n"
        "  assert (to_list (Node (Node (Leaf, 1, Leaf), 2, Node (Leaf, 3, Leaf))) = [1; 2; 3]);\n"
        "  assert (to_list Leaf = []);\n"
        "  assert (to_list (Node (Leaf, 5, Leaf)) = [5]);\n"
        "  assert (to_list (Node (Node (Node (Leaf, 1, Leaf), 2, Leaf), 3, Leaf)) = [1; 2; 3]);\n"
        ";;",
        "```ocaml\n"
        "let to_list (t : tree) : int list =\n"
        "  let rec walk t acc =\n"
        "    match t with\n"
        "    | Leaf -> acc\n"
        "    | Node (left, v, right) ->\n"
        "      let acc = walk right acc in\n"
        "      let acc = v :: acc in\n"
        "      walk left acc\n"
        "  in\n"
        "  walk t []\n"
        f"{END_MARKER}\n"
        "```",
    ),
]


def build_prompt_messages(problem: str, *, min_lines: int = 8, few_shot: int = 1) -> list[dict]:
    """System message, the first `few_shot` examples as earlier turns, then the problem (chat template)."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT.format(min_lines=min_lines)}]
    for example, _tests, answer in FEW_SHOT[:few_shot]:
        messages += [{"role": "user", "content": example}, {"role": "assistant", "content": answer}]
    messages.append({"role": "user", "content": problem})
    return messages


def check_few_shot(cfg: RewardConfig) -> None:
    """Refuse to start when a few-shot answer would not earn full marks under this run's reward settings."""
    for problem, tests, answer in FEW_SHOT:
        result = score_completion(problem, tests, answer, cfg=cfg)
        if result["total_reward"] < 1.0:
            name = problem.rsplit("let ", 1)[-1].split()[0]
            raise ConfigError(
                f"few-shot example {name!r} scores {result['total_reward']:.2f} under these reward settings "
                f"({result['stage']}: {result['reason']}); check MIN_NON_EMPTY_LINES and the reward weights"
            )


def prompt_token_count(tokenizer, messages: list[dict]) -> int:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def fitting_prompts(
    problems: list[dict], tokenizer, cfg: TrainConfig, source: str, note: Callable[[str], None]
):
    """(problem, chat messages) for every problem whose prompt fits GRPO_MAX_PROMPT; the rest counted."""
    fitting = []
    for p in problems:
        messages = build_prompt_messages(
            p["problem"], min_lines=cfg.min_non_empty_lines, few_shot=cfg.few_shot
        )
        if prompt_token_count(tokenizer, messages) <= cfg.max_prompt_length:
            fitting.append((p, messages))
    dropped = len(problems) - len(fitting)
    note(
        f"dataset: {len(fitting)} problems from {source}; {dropped} dropped as longer than "
        f"GRPO_MAX_PROMPT={cfg.max_prompt_length} tokens"
    )
    if not fitting:
        raise ConfigError(f"GRPO_MAX_PROMPT={cfg.max_prompt_length}: no problem of {source} fits; raise it")
    return fitting


def build_train_dataset(problems: list[dict], tokenizer, cfg: TrainConfig, note: Callable[[str], None]):
    """The rows TRL sees: chat `prompt` plus the columns the reward reads; prompts over the limit dropped."""
    from datasets import Dataset

    rows = [
        {"prompt": messages, "problem_id": p["id"], "problem": p["problem"], "tests": p["tests"]}
        for p, messages in fitting_prompts(problems, tokenizer, cfg, cfg.training_dataset, note)
    ]
    return Dataset.from_list(rows)


def sft_answer(problem: dict) -> str:
    """The reference solution as the answer the reward pays for: one fenced block with the complete
    definition (the problem's signature line unless the solution has its own), ending with END."""
    parsed = parse_problem(problem["problem"])
    code = problem["solution"].strip("\n").rstrip()
    if own_definition(code, parsed.function) is None:  # the reward's own reading of "defines f itself"
        code = f"{parsed.signature}\n{code}"
    return f"```ocaml\n{code}\n{END_MARKER}\n```"


def build_sft_dataset(problems: list[dict], tokenizer, cfg: TrainConfig, note: Callable[[str], None]):
    """Prompt-completion rows for TRL's SFTTrainer: GRPO's chat prompt and the reference answer. Answers
    longer than GRPO_MAX_COMPLETION tokens (GRPO could never sample them) are skipped and counted."""
    from datasets import Dataset

    source = cfg.sft_dataset or cfg.training_dataset
    rows, too_long = [], 0
    for p, messages in fitting_prompts(problems, tokenizer, cfg, source, note):
        answer = sft_answer(p)
        if len(tokenizer(answer, add_special_tokens=False)["input_ids"]) >= cfg.max_completion_length:
            too_long += 1
            continue
        rows.append({"prompt": messages, "completion": [{"role": "assistant", "content": answer}]})
    if too_long:
        note(
            f"sft: {too_long} answers dropped as longer than GRPO_MAX_COMPLETION={cfg.max_completion_length}"
        )
    if not rows:
        raise ConfigError(f"SFT_DATASET={source!r}: no problem with a solution that fits the length limits")
    return Dataset.from_list(rows)


# ------------------------------------------------------------------------------------------------------------
# Logs


def append_log_line(path: Path | str, text: str) -> None:
    """Append one line and flush it, so that a crash or a kill loses nothing already logged."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(text.rstrip("\n") + "\n")
        f.flush()


def _num(value: Any) -> float:
    return math.nan if value is None else float(value)


def format_log_line(logs: Mapping[str, Any], reward_name: str = "syntax_aware_reward") -> str:
    """One learning.log line in the seed's format (a missing metric prints as nan)."""
    m = {k: _num(logs.get(k)) for k in ("epoch", "loss", "grad_norm", "learning_rate", "entropy")}
    r = {k: _num(logs.get(k)) for k in ("reward", "reward_std", "frac_reward_zero_std")}
    own_mean = _num(logs.get(f"rewards/{reward_name}/mean"))
    own_std = _num(logs.get(f"rewards/{reward_name}/std"))
    return (
        f"[Epoch {m['epoch']:.2f}]  loss={m['loss']:<7.4f}  grad={m['grad_norm']:.4f}  "
        f"lr={m['learning_rate']:.2e}  reward={r['reward']:.3f}±{r['reward_std']:.3f}  "
        f"syntax_rew={own_mean:.3f}±{own_std:.3f}  entropy={m['entropy']:.3f}  "
        f"frac_zero_std={r['frac_reward_zero_std']:.2f}"
    )


def format_sft_line(logs: Mapping[str, Any]) -> str:
    """One sft/learning.log line: the loss and token accuracy on the answer tokens."""
    m = {k: _num(logs.get(k)) for k in ("epoch", "loss", "mean_token_accuracy", "grad_norm", "learning_rate")}
    return (
        f"[SFT Epoch {m['epoch']:.2f}]  loss={m['loss']:.4f}  token_acc={m['mean_token_accuracy']:.3f}  "
        f"grad={m['grad_norm']:.4f}  lr={m['learning_rate']:.2e}"
    )


def format_eval_line(row: Mapping[str, Any]) -> str:
    """One learning.log line for a held-out evaluation, from its metrics.jsonl row."""
    stages = "  ".join(f"{s}={_num(row.get(f'eval/stages/{s}')):.2f}" for s in STAGES)
    return (
        f"[Eval Epoch {_num(row.get('epoch')):.2f}]  step={row['step']}  problems={row['eval/problems']}  "
        f"samples={row['eval/samples']}  pass@1={row['eval/pass@1']:.3f}  "
        f"reward={row['eval/reward']:.3f}±{row['eval/reward_std']:.3f}  {stages}"
    )


def use_step_lines(
    trainer,
    log_path: Path,
    metrics_path: Path,
    line: Callable[[Mapping[str, Any]], str],
    console_lines: int | None = None,
) -> None:
    """Replace the trainer's progress callback by one that draws the same bar with one readable line per
    logging step under it, instead of the raw metric dict; the line also goes to learning.log and every metric
    to metrics.jsonl. Only the main process writes. The end-of-training summary (train_loss, ...) goes to
    metrics.jsonl only. With `console_lines` the console shows about that many of the lines, evenly spread."""
    from transformers import ProgressCallback

    class StepLines(ProgressCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if not state.is_world_process_zero or not logs:
                return
            append_log_line(metrics_path, json.dumps({"step": state.global_step, **logs}))
            if "loss" in logs:
                text = line(logs)
                append_log_line(log_path, text)
                every = max(1, state.max_steps // console_lines) if console_lines else 1
                if state.global_step % every == 0 or state.global_step == state.max_steps:
                    console(text)

    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(StepLines())


def console(text: str) -> None:
    """Print without breaking a progress bar that is being drawn."""
    from tqdm.auto import tqdm

    tqdm.write(text)


def write_header(
    log_path: Path,
    cfg: TrainConfig,
    sources: Mapping[str, str],
    resume_from: str | None,
    program: str = "train.py",
) -> None:
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    what = f"resumed from {resume_from}" if resume_from else "started"
    append_log_line(log_path, f"# {started}  {program} {what}; resolved configuration:")
    for key, value in dataclasses.asdict(cfg).items():
        append_log_line(log_path, f"#   {key} = {value}  ({sources.get(key, 'default')})")


# ------------------------------------------------------------------------------------------------------------
# Held-out evaluation


def bundled_path(name: str) -> str:
    """A relative path that is not there from the working directory but is in the repository (the default
    GRPO_EVAL_DATASET, data/heldout.jsonl) resolves to the repository's copy."""
    if not Path(name).expanduser().exists() and (ROOT / name).exists():
        return str(ROOT / name)
    return name


def split_held_out(
    problems: list[dict], cfg: TrainConfig, note: Callable[[str], None]
) -> tuple[list[dict], list[dict]]:
    """(training problems, held-out problems): GRPO_EVAL_DATASET's problems plus GRPO_EVAL_HOLDOUT of the
    training ones. A training problem with a held-out problem's id or function name is left out of training,
    so that the evaluation is on problems the model never trains on."""
    import random

    if cfg.eval_steps is None:
        return problems, []
    held = (
        load_problems(bundled_path(cfg.eval_dataset), warn=note, setting_name="GRPO_EVAL_DATASET")
        if cfg.eval_dataset
        else []
    )
    if cfg.eval_holdout:
        if cfg.eval_holdout >= len(problems):
            raise ConfigError(
                f"GRPO_EVAL_HOLDOUT={cfg.eval_holdout}: TRAINING_DATASET has {len(problems)} problems"
            )
        shuffled = random.Random(cfg.seed).sample(problems, len(problems))
        held, problems = held + shuffled[: cfg.eval_holdout], shuffled[cfg.eval_holdout :]
    ids = {p["id"] for p in held}
    names = {parse_problem(p["problem"]).function for p in held}
    kept = [p for p in problems if p["id"] not in ids and parse_problem(p["problem"]).function not in names]
    note(
        f"held-out evaluation: {len(held)} problems, {cfg.eval_samples} sample(s) each; "
        f"{len(problems) - len(kept)} training problems left out as the same problem"
    )
    return kept, held


def eval_row(step: int, epoch: float, summary: Mapping[str, Any]) -> dict:
    """The metrics.jsonl row of one evaluation (evaluate.summarize's summary)."""
    return {
        "step": step,
        "epoch": epoch,
        "eval/problems": summary["problems"],
        "eval/samples": summary["k"],
        "eval/pass@1": summary["pass@1"],
        "eval/reward": summary["mean_reward"],
        "eval/reward_std": summary["reward_std"],
        **{f"eval/stages/{stage}": share for stage, share in summary["stages"].items()},
    }


def held_out_evaluation(problems: list[dict], tokenizer, cfg: TrainConfig, record: Callable[[dict], None]):
    """A callback that samples the policy on the held-out problems and scores them with the run's reward
    before the first step, every GRPO_EVAL_STEPS steps and at the end; `record` gets each row. Only the main
    process evaluates (the others wait for it at their next step)."""
    from transformers import TrainerCallback

    import evaluate as heldout  # evaluate.py imports this module

    round_size = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps * cfg.num_generations

    class HeldOutEvaluation(TrainerCallback):
        def __init__(self) -> None:
            self.done: set[int] = set()
            self.after_log = False

        def run(self, state, model) -> None:
            if state.global_step in self.done or not state.is_world_process_zero:
                return
            self.done.add(state.global_step)
            # Batches of a training round's size: a compiled sampler reuses the graph it has.
            samples = heldout.sample_completions(
                model, tokenizer, problems, cfg, k=cfg.eval_samples, batch_size=round_size, seed=cfg.seed
            )
            summary = heldout.summarize(heldout.score_samples(samples, problems, cfg), k=cfg.eval_samples)
            record(eval_row(state.global_step, float(state.epoch or 0.0), summary))

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            if state.global_step == 0:  # a resumed run has its baseline in the log already
                self.run(state, model)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % cfg.eval_steps == 0:
                if control.should_log:  # after the step's own line, which on_log writes
                    self.after_log = True
                else:
                    self.run(state, model)

        def on_log(self, args, state, control, model=None, **kwargs):
            if self.after_log:
                self.after_log = False
                self.run(state, model)

        def on_train_end(self, args, state, control, model=None, **kwargs):
            self.run(state, model)

    return HeldOutEvaluation()


# ------------------------------------------------------------------------------------------------------------
# Model


CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_tiny_model(path: Path, layers: int = 2, width: int = 64) -> Path:
    """A tiny randomly initialised Qwen2 model and a byte-level BPE tokenizer trained on the bundled problems.

    Built locally in about a second, no download: the demo and the tests train it end to end.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    texts = [SYSTEM_PROMPT, *(part for example in FEW_SHOT for part in example)]
    for line in (
        *BUNDLED_PROBLEMS.read_text(encoding="utf-8").splitlines(),
        *DEMO_SFT.read_text(encoding="utf-8").splitlines(),
    ):
        row = json.loads(line)
        texts += [row["prompt"], row["solution"]]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=2048, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=CHATML_TEMPLATE
    )
    tokenizer.save_pretrained(path)

    model_config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(model_config).save_pretrained(path)
    return path


def model_card(
    cfg: TrainConfig, sources: Mapping[str, str], metrics_path: Path, weights: Path, *, sft: bool = False
) -> str:
    """The README.md of an output folder: what was trained from what, the settings that differ from the
    defaults, the last metrics, and how to load and merge `weights` (the adapter, or --sft's model)."""
    rows = [
        json.loads(line) for line in metrics_path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]
    last = next((r for r in reversed(rows) if "loss" in r), {})
    last_eval = next((r for r in reversed(rows) if "eval/pass@1" in r), None)
    full_model = sft and cfg.sft_all_weights
    method = "supervised fine-tuning (TRL's SFTTrainer) on reference solutions" if sft else "GRPO (TRL)"
    dataset = cfg.sft_dataset or cfg.training_dataset if sft else cfg.training_dataset
    changed = [
        f"| `{f.metadata['env']}` | `{getattr(cfg, f.name)}` | {sources[f.name]} |"
        for f in dataclasses.fields(cfg)
        if "env" in f.metadata and getattr(cfg, f.name) != f.default
    ]
    metrics = [f"| {name} | {_num(last.get(key)):.4g} |" for name, key in CARD_METRICS if key in last]
    lines = [
        "---",
        f"base_model: {cfg.model_id}",
        f"library_name: {'transformers' if full_model else 'peft'}",
        "tags: [ocaml, code, trl, grpo, sft, lora]",
        "---",
        "",
        f"# {Path(cfg.output_dir).name}: OCaml code generation",
        "",
        f"Base model `{cfg.model_id}`, trained by {method} with ocaml-grpo's train.py on `{dataset}`; every "
        "completion scored by the OCaml toolchain (END marker, type-check, compile, tests).",
        "",
        "## Settings that differ from the defaults",
        "",
        "| setting | value | from |",
        "|---|---|---|",
        *(changed or ["| (none) | | |"]),
        "",
        f"## Last metrics (step {last.get('step', 'n/a')}, epoch {_num(last.get('epoch')):.2f})",
        "",
        "| metric | value |",
        "|---|---|",
        *metrics,
    ]
    if last_eval:
        lines += [
            f"| held-out pass@1 (step {last_eval['step']}, {last_eval['eval/problems']} problems) | "
            f"{last_eval['eval/pass@1']:.3f} |",
            f"| held-out mean reward | {last_eval['eval/reward']:.3f} |",
        ]
    if full_model:
        load = [
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "",
            f'model = AutoModelForCausalLM.from_pretrained("{weights}", dtype="auto")',
            f'tokenizer = AutoTokenizer.from_pretrained("{weights}")',
        ]
        merge = ["All weights were trained: the folder is a full model, there is nothing to merge."]
    else:
        load = [
            "from peft import PeftModel",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "",
            f'base = AutoModelForCausalLM.from_pretrained("{cfg.model_id}", dtype="auto")',
            f'model = PeftModel.from_pretrained(base, "{weights}")',
            f'tokenizer = AutoTokenizer.from_pretrained("{weights}")',
        ]
        merge = [
            "```python",
            'model.merge_and_unload().save_pretrained("merged")  # base + adapter as one plain model',
            'tokenizer.save_pretrained("merged")',
            "```",
            "",
            "(`python train.py --merge-to DIR` does the same at the end of a run.)",
        ]
    lines += ["", "## Load", "", "```python", *load, "```", "", "## Merge", "", *merge, ""]
    return "\n".join(lines)


CARD_METRICS = (
    ("loss", "loss"),
    ("mean reward", "reward"),
    ("reward std", "reward_std"),
    ("share of completions passing every test", "stages/passed"),
    ("frac_zero_std", "frac_reward_zero_std"),
    ("entropy", "entropy"),
    ("token accuracy", "mean_token_accuracy"),
)


def model_card_callback(output_dir: Path, card: Callable[[], str]):
    """Writes our README.md into the output folder after every checkpoint, over the draft TRL writes there."""
    from transformers import TrainerCallback

    class ModelCard(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                (output_dir / "README.md").write_text(card(), encoding="utf-8")

    return ModelCard()


def merge_adapter(model_id: str, adapter_dir: Path, out_dir: Path) -> None:
    """Base model + LoRA adapter folded into one model, loaded afresh so that it works after any launcher."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(model_id, dtype="auto")
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(adapter_dir).save_pretrained(out_dir)


def latest_checkpoint(output_dir: Path) -> Path | None:
    checkpoints = [p for p in output_dir.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()]
    return max(checkpoints, key=lambda p: int(p.name.split("-")[-1]), default=None)


# ------------------------------------------------------------------------------------------------------------
# Training


def grpo_args(cfg: TrainConfig, use_bf16: bool):
    import torch
    from trl import GRPOConfig

    # The seed's step: GRPO_BATCH_SIZE prompts x GRPO_NUM_GENERATIONS completions, sampled in one round
    # (TRL needs a round to hold whole groups) and trained in passes of GRPO_BATCH_SIZE completions. TRL
    # samples a round every gradient_accumulation_steps passes, so every optimizer step gets fresh rewards
    # and any batch works with any group size.
    return GRPOConfig(
        output_dir=cfg.output_dir,
        per_device_train_batch_size=cfg.per_device_train_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps * cfg.num_generations,
        num_generations=cfg.num_generations,
        max_completion_length=cfg.max_completion_length,
        num_train_epochs=cfg.num_train_epochs,
        max_steps=cfg.max_steps or -1,
        learning_rate=cfg.learning_rate,
        temperature=cfg.temperature,
        max_grad_norm=cfg.max_grad_norm,
        logging_steps=cfg.logging_steps,
        save_steps=cfg.save_steps,
        save_total_limit=cfg.save_total_limit,
        beta=cfg.beta,
        loss_type=cfg.loss_type,
        epsilon_high=cfg.epsilon_high,
        mask_truncated_completions=cfg.mask_truncated_completions,
        top_entropy_quantile=cfg.top_entropy_quantile,
        scale_rewards=cfg.scale_rewards,
        report_to=cfg.report_to,
        use_vllm=cfg.generation == "vllm",
        vllm_mode=cfg.vllm_mode,
        # transformers 5's name for gradient_checkpointing (GRPOConfig sets both). auto starts as TRL's
        # default, on; train() settles it once the model and the device are known.
        activation_checkpointing=cfg.gradient_checkpointing != "off",
        bf16=use_bf16,
        dataloader_pin_memory=torch.cuda.is_available(),  # pinning is for copies to a GPU
        # Every LoRA weight takes part in every forward pass; transformers would otherwise have DDP search for
        # unused ones whenever checkpointing is off (and torch warn that it found none).
        ddp_find_unused_parameters=False,
        seed=cfg.seed,
        # Load the weights in the dtype they were saved in (bf16 for Qwen2.5) rather than TRL's float32:
        # half the memory, and generation, which runs outside autocast, at bf16 speed. With
        # GRPO_INIT_ADAPTER train.py loads the model itself, the same way.
        model_init_kwargs=None if cfg.init_adapter else {"dtype": "auto"},
    )


def load_tokenizer(model_id: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_id)
    except (OSError, ValueError) as err:
        reason = " ".join(str(err).split())  # transformers' messages span lines; ours are one line
        raise ConfigError(f"GRPO_MODEL_ID={model_id!r}: cannot load its tokenizer ({reason})") from None


def quiet_libraries() -> None:
    """Silence library output that tells a user nothing: a progress bar per model file loaded or saved (the
    trainer's own bar stays), and the deprecation warning that TRL's own calls raise in transformers 5."""
    import warnings

    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    warnings.filterwarnings(
        "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
    )


def print_nothing(text: str) -> None:
    """What processes other than the main one do with log lines and notes."""


def policy_with_adapter(cfg: TrainConfig):
    """GRPO_MODEL_ID with the trainable LoRA adapter of GRPO_INIT_ADAPTER (say, --sft's) for GRPO to train."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    torch.manual_seed(cfg.seed)
    base = AutoModelForCausalLM.from_pretrained(cfg.model_id, dtype="auto")
    return PeftModel.from_pretrained(base, cfg.init_adapter, is_trainable=True)


def lora_config(cfg: TrainConfig):
    from peft import LoraConfig

    return LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        bias=cfg.lora_bias,
        target_modules=[name.strip() for name in cfg.lora_target_modules.split(",")],
        task_type="CAUSAL_LM",
    )


def train(
    cfg: TrainConfig, sources: Mapping[str, str], *, resume: bool = False, merge_to: str | None = None
) -> Path:
    """Run GRPO and return the adapter folder; whatever can be refused is refused before the model loads."""
    output_dir = Path(cfg.output_dir)
    last = latest_checkpoint(output_dir)
    if resume and last is None:
        raise ConfigError(f"--resume: no checkpoint-* folder in GRPO_OUTPUT_DIR={cfg.output_dir!r}")
    if not resume and last is not None:  # a second run would overwrite its checkpoints and mix the logs
        raise ConfigError(
            f"GRPO_OUTPUT_DIR={cfg.output_dir!r} holds {last.name} of an earlier run: pass --resume to "
            "continue it, or choose another GRPO_OUTPUT_DIR"
        )
    resume_from = last if resume else None
    check_toolchain()
    check_few_shot(cfg)

    import torch
    from trl import GRPOTrainer

    import generation
    from monitor import HealthMonitor, read_jsonl

    quiet_libraries()
    # GRPOConfig sets up the distributed state, so it comes before anything that asks for the main process.
    args = grpo_args(cfg, use_bf16=torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    is_main = args.process_index == 0
    log_path, metrics_path = output_dir / "learning.log", output_dir / "metrics.jsonl"
    output_dir.mkdir(parents=True, exist_ok=True)
    write_line = (lambda text: (append_log_line(log_path, text), console(text))) if is_main else print_nothing
    note = (
        (lambda text: (console(text), append_log_line(log_path, f"# {text}"))) if is_main else print_nothing
    )
    if is_main:
        write_header(log_path, cfg, sources, resume_from.name if resume_from else None)
    note(
        f"launch: distributed type: {args.distributed_state.distributed_type.value}, "
        f"processes: {args.world_size}, device: {args.device}"
    )

    problems, held_out = split_held_out(load_problems(cfg.training_dataset, warn=note), cfg, note)
    tokenizer = load_tokenizer(cfg.model_id)
    dataset = build_train_dataset(problems, tokenizer, cfg, note)
    prompts_per_round = args.generation_batch_size // cfg.num_generations
    if len(dataset) < prompts_per_round:
        raise ConfigError(
            f"TRAINING_DATASET={cfg.training_dataset!r}: {len(dataset)} usable problems, but one generation "
            f"step takes {prompts_per_round}; lower GRPO_BATCH_SIZE or GRPO_GRAD_ACCUM_STEPS"
        )

    checkpointing, why = generation.gradient_checkpointing(
        cfg.gradient_checkpointing,
        cfg.model_id,
        tokens_per_pass=cfg.per_device_train_batch_size * (cfg.max_prompt_length + cfg.max_completion_length),
        memory_bytes=generation.device_memory(args.device),
    )
    # Settled before TRL reads it; transformers 5 calls it activation_checkpointing, GRPOConfig has both.
    args.gradient_checkpointing = args.activation_checkpointing = checkpointing
    note(f"sampling: {cfg.generation}; gradient checkpointing: {'on' if checkpointing else 'off'} ({why})")
    if cfg.init_adapter:
        note(f"GRPO continues to train the adapter {cfg.init_adapter} on {cfg.model_id}")
    policy = policy_with_adapter(cfg) if cfg.init_adapter else cfg.model_id
    adapter_dir = output_dir / "adapter"
    card = lambda: model_card(cfg, sources, metrics_path, adapter_dir)
    reward = SyntaxAwareReward(
        cfg, log_dir=output_dir / "reward_logs", max_completion_length=cfg.max_completion_length
    )
    try:
        trainer = GRPOTrainer(
            model=policy,
            reward_funcs=[reward],
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=None if cfg.init_adapter else lora_config(cfg),
        )
        if cfg.generation == "compiled":
            generation.CompiledSampler(cfg.max_prompt_length, note).install(trainer.model)
        # The step line first, then the monitor's WARNING/OK lines about it, then an evaluation's line.
        use_step_lines(trainer, log_path, metrics_path, lambda logs: format_log_line(logs, reward.__name__))
        # On --resume the monitor starts from what was logged up to the checkpoint (it cuts at the step).
        health = HealthMonitor(
            write_line, cfg.stop_on_red_flags, earlier=read_jsonl(metrics_path) if resume_from else []
        )
        trainer.add_callback(health)
        if held_out:

            def record(row: dict) -> None:
                append_log_line(metrics_path, json.dumps(row))
                write_line(format_eval_line(row))
                health.add_eval(row)  # the memorising WARNING/OK about it

            trainer.add_callback(held_out_evaluation(held_out, tokenizer, cfg, record))
        trainer.add_callback(model_card_callback(output_dir, card))
        trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
        trainer.save_model(str(adapter_dir))
    finally:
        reward.close()
    if is_main:
        for folder in (output_dir, adapter_dir):
            (folder / "README.md").write_text(card(), encoding="utf-8")
    note(f"adapter (PEFT format) saved to {adapter_dir}")
    if merge_to and is_main:
        merge_adapter(cfg.model_id, adapter_dir, Path(merge_to))
        note(f"merged model saved to {merge_to}")
    return adapter_dir


def sft_trainer(cfg: TrainConfig, note: Callable[[str], None]):
    """TRL's SFTTrainer on GRPO's chat prompt and the reference answers, with the loss on the answer tokens
    only (TRL's completion-only loss for prompt-completion rows), writing into GRPO_OUTPUT_DIR/sft/."""
    import torch
    from trl import SFTConfig, SFTTrainer

    import generation

    checkpointing, _ = generation.gradient_checkpointing(
        cfg.gradient_checkpointing,
        cfg.model_id,
        tokens_per_pass=cfg.sft_batch_size * (cfg.max_prompt_length + cfg.max_completion_length),
        memory_bytes=generation.device_memory(torch.device("cuda" if torch.cuda.is_available() else "cpu")),
    )
    args = SFTConfig(
        output_dir=str(Path(cfg.output_dir) / "sft"),
        num_train_epochs=cfg.sft_num_epochs,
        max_steps=cfg.sft_max_steps or -1,
        learning_rate=cfg.sft_learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=0.1,
        per_device_train_batch_size=cfg.sft_batch_size,
        max_length=cfg.max_prompt_length + cfg.max_completion_length,
        completion_only_loss=True,
        logging_steps=cfg.logging_steps,
        save_strategy="no",
        report_to=cfg.report_to,
        seed=cfg.seed,
        bf16=torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
        activation_checkpointing=checkpointing,
        dataloader_pin_memory=torch.cuda.is_available(),
        ddp_find_unused_parameters=False,
        model_init_kwargs={"dtype": "auto"},
    )
    source = cfg.sft_dataset or cfg.training_dataset
    problems = load_problems(
        source, warn=note, for_sft=True, setting_name="SFT_DATASET" if cfg.sft_dataset else "TRAINING_DATASET"
    )
    tokenizer = load_tokenizer(cfg.model_id)
    return SFTTrainer(
        model=cfg.model_id,
        args=args,
        train_dataset=build_sft_dataset(problems, tokenizer, cfg, note),
        processing_class=tokenizer,
        peft_config=None if cfg.sft_all_weights else lora_config(cfg),
    )


def sft(cfg: TrainConfig, sources: Mapping[str, str]) -> Path:
    """The supervised warm start (--sft). Returns GRPO_OUTPUT_DIR/sft/adapter (for GRPO_INIT_ADAPTER), or
    sft/model with SFT_ALL_WEIGHTS (for GRPO_MODEL_ID); per-step loss and token accuracy go to
    sft/learning.log and sft/metrics.jsonl."""
    out = Path(cfg.output_dir) / "sft"
    final = out / ("model" if cfg.sft_all_weights else "adapter")
    if final.exists():
        raise ConfigError(
            f"GRPO_OUTPUT_DIR={cfg.output_dir!r} already holds {final}: move it, or choose another"
        )
    quiet_libraries()
    from accelerate import PartialState

    is_main = PartialState().is_main_process
    out.mkdir(parents=True, exist_ok=True)
    log_path, metrics_path = out / "learning.log", out / "metrics.jsonl"
    note = (
        (lambda text: (console(text), append_log_line(log_path, f"# {text}"))) if is_main else print_nothing
    )
    if is_main:
        write_header(log_path, cfg, sources, None, program="train.py --sft")
    trainer = sft_trainer(cfg, note)
    use_step_lines(trainer, log_path, metrics_path, format_sft_line, console_lines=20)
    trainer.train()
    trainer.save_model(str(final))
    if is_main:
        (final / "README.md").write_text(
            model_card(cfg, sources, metrics_path, final, sft=True), encoding="utf-8"
        )
    if cfg.sft_all_weights:
        note(f"SFT model saved to {final}; start GRPO from it with --model-id {final}")
    else:
        note(f"SFT adapter saved to {final}; start GRPO from it with --init-adapter {final}")
    return final


def run_demo(cfg: TrainConfig, sources: dict[str, str], args: argparse.Namespace) -> None:
    """The whole pipeline on the CPU: a tiny model, its SFT warm start, GRPO with held-out evaluation, and
    the run report."""
    import torch

    import analyze

    started = time.monotonic()
    quiet_libraries()
    out = Path(cfg.output_dir)
    if sources["output_dir"] == "demo" and not args.resume:
        shutil.rmtree(out, ignore_errors=True)  # each `make demo` starts afresh in its own folder
    # The tiny model gains nothing from a second thread, and busy-waiting threads make it several times
    # slower when the cores are shared (CI runs other tests beside it).
    torch.set_num_threads(1)
    sft_model = out / "sft" / "model"
    if sources["model_id"] == "demo":
        if not (Path(cfg.model_id) / "config.json").is_file():
            build_tiny_model(Path(cfg.model_id), **DEMO_MODEL_SHAPE)
        if not (sft_model / "config.json").is_file():
            sft(dataclasses.replace(cfg, sft_all_weights=True), sources)
        cfg = dataclasses.replace(cfg, model_id=str(sft_model))
    adapter_dir = train(cfg, sources, resume=args.resume, merge_to=args.merge_to)
    report, plots = analyze.write_report(analyze.load_run(out))
    checkpoint = latest_checkpoint(out)
    outputs = [
        ("sft/", "the SFT warm start: model/, learning.log, metrics.jsonl"),
        ("learning.log", "GRPO: one line per step in the seed's format, [Eval ...] lines, warnings"),
        ("metrics.jsonl", "every metric TRL logged, and the evaluations"),
        ("reward_logs/", "completions.jsonl and syntax_aware_breakdown.jsonl"),
        (f"{checkpoint.name}/" if checkpoint else "checkpoint-*/", "the last checkpoint, for --resume"),
        (f"{adapter_dir.name}/", "the LoRA adapter in PEFT format, with its model card"),
        ("analysis.md", "the run report (python analyze.py " + str(out) + ")"),
    ]
    print(f"\nDemo finished in {time.monotonic() - started:.0f} s. Outputs in {out.resolve()}/:")
    for name, what in outputs:
        print(f"  {name:<16} {what}")
    print(f"\nStatus: {report.status}\nDecision: {report.decision}")
    print("Plots: " + ", ".join(str(p) for p in plots))


def main(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.config_table:
        print(config.markdown_table(TrainConfig))
        return 0
    try:
        cfg, sources = parse_config(argv, environ, demo=args.demo)
        if args.print_config:
            resolved = {k: {"value": v, "source": sources[k]} for k, v in dataclasses.asdict(cfg).items()}
            print(json.dumps(resolved, indent=2))
            return 0
        if args.demo:
            run_demo(cfg, sources, args)
        elif args.sft:
            sft(cfg, sources)
        else:
            train(cfg, sources, resume=args.resume, merge_to=args.merge_to)
    except (ConfigError, ToolchainMissing) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
