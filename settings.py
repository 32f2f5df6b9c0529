"""Every setting of a run, declared once: `TrainConfig`, the reward's settings and the trainer's.

Each field names its env variable, its default and its help; `envflags.py`, the mechanism, turns the fields
into CLI flags, the resolution flag > env > default, the checks, and the generated table in
docs/configuration.md. Nothing here
imports torch (GRPO_GENERATION=auto asks it only where libcuda shows a GPU), so a bad value stops in well
under a second, before any model loads.
"""

from __future__ import annotations

import ctypes
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from envflags import ConfigError, setting
from models import is_gguf, looks_local
from problems import bundled_path
from rewards import RewardConfig

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


def compiled_refusal(environ: Mapping[str, str]) -> str | None:
    """Why the compiled sampler must not run under these settings, or None: frozen weights would sample the
    first round's policy all run long; sharded ones are gathered into new memory every round (no fold of
    the graph's inputs, CUDA graphs recorded again each time)."""
    if environ.get("TORCHINDUCTOR_FREEZING") == "1":
        return "TORCHINDUCTOR_FREEZING=1 bakes the first round's weights into the compiled graph"
    if environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true"):
        return "FSDP shards the weights"
    if environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE") == "3":
        return "DeepSpeed ZeRO-3 shards the weights"
    return None


def torch_cuda_missing() -> str | None:
    """Why torch cannot compile for a GPU here, or None. libcuda is asked first, so a box without a GPU
    resolves without importing torch; where it shows one, torch is asked too (a CPU-only wheel or a driver
    older than the wheel's CUDA shows a GPU to libcuda and none to torch), and triton must be there."""
    if not _cuda_visible():
        return "no CUDA device"
    import torch

    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        return f"the driver shows a GPU but torch {torch.__version__} ({build}) cannot use it"
    if importlib.util.find_spec("triton") is None:
        return "triton (torch.compile's GPU code generator) is not installed"
    return None


def generation_choice(choice: str, environ: Mapping[str, str]) -> tuple[str, str]:
    """GRPO_GENERATION resolved, and why: `auto` is the compiled sampler where torch can compile for CUDA and
    nothing refuses it, TRL's plain sampling elsewhere (vLLM is never picked for you: it is a separate
    install, and it takes GPU memory or a second GPU). An explicit `compiled` that is refused stops."""
    refusal = compiled_refusal(environ) if choice in ("auto", "compiled") else None
    if choice == "compiled" and refusal:
        raise ConfigError(f"GRPO_GENERATION=compiled: {refusal}; set GRPO_GENERATION=plain")
    if choice != "auto":
        return choice, "as set"
    missing = refusal or torch_cuda_missing()
    return ("plain", f"auto: {missing}") if missing else ("compiled", "auto: torch compiles for CUDA here")


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
        4,
        "GRPO_BATCH_SIZE",
        "prompts per device per step; also completions per forward/backward pass (on the CPU a whole group "
        "where that is more)",
        low=1,
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
    reward_control: str = setting(
        "none",
        "GRPO_REWARD_CONTROL",
        "shuffled: a control run, trained on the OCaml reward's values permuted across each step's "
        "completions (same mean and spread, blind to correctness; logs keep the real rewards; "
        "reward_control.py); none: the reward itself",
        choices=("none", "shuffled"),
    )
    report_to: str = setting(
        "trackio",
        "GRPO_REPORT_TO",
        "experiment tracker; trackio keeps the dashboard's data local (make dashboard; docs/dashboard.md)",
        choices=tuple(["none", *TRACKER_PACKAGES]),
        check=_tracker_installed,
    )
    trackio_dir: str | None = setting(
        None,
        "TRACKIO_DIR",
        "folder of trackio's data with GRPO_REPORT_TO=trackio; none = GRPO_OUTPUT_DIR/trackio (one folder "
        "for many runs puts them side by side in one dashboard)",
    )
    generation: str = setting(
        "auto",
        "GRPO_GENERATION",
        "how completions are sampled: plain (TRL's), compiled (LoRA unmerged, static cache, compiled "
        "step; docs/speed.md), vllm (requirements-gpu.txt); auto: compiled where torch compiles for CUDA, "
        "else plain",
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
    monitor_bands: str = setting(
        "relative",
        "GRPO_MONITOR_BANDS",
        "run-health bands of the monitor and analyze.py: relative (each metric against the run's own first "
        "steps and median) or seed (the seed analysis's absolute bands; docs/run-health.md)",
        choices=("relative", "seed"),  # health_bands.PROFILES (a test keeps the two equal)
    )
    stop_on_red_flags: bool = setting(
        False,
        "GRPO_STOP_ON_RED_FLAGS",
        "stop (checkpoint saved) when the stop criteria of GRPO_MONITOR_BANDS hold",
    )
    dynamic_sampling: str = setting(
        "off",
        "GRPO_DYNAMIC_SAMPLING",
        "filter: drop the groups whose rewards all tie and sample further prompts, in data order, to fill "
        "the step (DAPO's dynamic sampling; docs/dynamic-sampling.md)",
        choices=("off", "filter"),
    )
    dynamic_max_rounds: int = setting(
        3, "GRPO_DYNAMIC_MAX_ROUNDS", "filter: extra rounds of prompts one step may sample at most", low=0
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
        high=1,  # the examples prompts.FEW_SHOT holds (a test keeps the two equal)
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
    sft_validation: int = setting(
        0,
        "SFT_VALIDATION",
        "--sft: problems of the SFT data (picked by GRPO_SEED) kept out of training as a validation split; "
        "their answers' loss is measured twice an epoch (at least twice a run) and the point with the lowest "
        "is kept; 0 = none, the end of the run",
        low=0,
    )
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


def round_rows(cfg: TrainConfig) -> int:
    """Completions one process samples per optimizer step (one round): prompts x accumulation x group."""
    return cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps * cfg.num_generations


def check_paths(cfg: TrainConfig, sources: Mapping[str, str]) -> None:
    """Local model and dataset paths must exist; each failure is one line."""
    model_path = Path(cfg.model_id).expanduser()
    if is_gguf(cfg.model_id) and not model_path.is_file():
        raise ConfigError(f"GRPO_MODEL_ID={cfg.model_id!r}: no such GGUF file")
    model_missing = not (model_path / "config.json").is_file() and sources["model_id"] != "demo"
    if looks_local(cfg.model_id) and model_missing and not is_gguf(cfg.model_id):
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
