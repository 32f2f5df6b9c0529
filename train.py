"""GRPO + LoRA training of a causal LM on OCaml problems, rewarded by the real OCaml toolchain.

    python train.py                      # settings from flags > env (.envrc) > defaults
    python train.py --print-config       # the resolved settings as JSON, nothing loaded
    python train.py --demo               # tiny local model, bundled problems, CPU, a few dozen steps

TRL's GRPOTrainer does the sampling, advantages and updates; PEFT adds the LoRA adapter; `rewards.py` scores
every completion with the OCaml compiler. This file resolves the settings, builds the dataset and prompt,
and writes the logs the seed analysis reads: learning.log (one line per logging step) and metrics.jsonl.
Torch, transformers, TRL and PEFT are imported only after every setting has been checked, so a bad value
stops in well under a second and never after the model has loaded.
"""

from __future__ import annotations

import argparse
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
from rewards import END_MARKER, RewardConfig, SyntaxAwareReward, parse_problem, score_completion

ROOT = Path(__file__).resolve().parent
BUNDLED_PROBLEMS = ROOT / "data" / "problems.jsonl"
README = ROOT / "README.md"

LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")
TRACKER_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}


def _tracker_installed(name: str) -> str | None:
    if name != "none" and importlib.util.find_spec(TRACKER_PACKAGES[name]) is None:
        return f"the {name} package is not installed (pip install {TRACKER_PACKAGES[name]}), or use none"
    return None


def _vllm_installed(use: bool) -> str | None:
    if use and importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed: pip install -r requirements-gpu.txt on the GPU box"
    return None


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
    use_vllm: bool = setting(
        False, "GRPO_USE_VLLM", "generate with vLLM (requirements-gpu.txt)", check=_vllm_installed
    )
    vllm_mode: str = setting(
        "colocate",
        "GRPO_VLLM_MODE",
        "vLLM in the training process or a `trl vllm-serve` server",
        choices=("colocate", "server"),
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


# The demo pins what decides its run time, so an .envrc in the shell cannot turn it into a long run;
# flags still win. Its model is built locally into <output_dir>/tiny-model.
DEMO_SETTINGS = {
    "GRPO_OUTPUT_DIR": "grpo_runs/demo",
    "TRAINING_DATASET": str(BUNDLED_PROBLEMS),
    "GRPO_BATCH_SIZE": "4",
    "GRPO_GRAD_ACCUM_STEPS": "1",
    "GRPO_NUM_GENERATIONS": "6",
    "GRPO_MAX_PROMPT": "704",
    "GRPO_MAX_COMPLETION": "48",
    "GRPO_MAX_STEPS": "20",
    "GRPO_LEARNING_RATE": "1e-4",
    "GRPO_SAVE_STEPS": "10",
    "GRPO_SAVE_TOTAL_LIMIT": "2",
    "GRPO_USE_VLLM": "0",
    "GRPO_REPORT_TO": "none",
    "LORA_R": "8",
    "LORA_ALPHA": "16",
}


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
    check_paths(cfg, sources)
    return cfg, sources


def check_paths(cfg: TrainConfig, sources: Mapping[str, str]) -> None:
    """Local model and dataset paths must exist; each failure is one line."""
    model_path = Path(cfg.model_id).expanduser()
    model_missing = not (model_path / "config.json").is_file() and sources["model_id"] != "demo"
    if _looks_local(cfg.model_id) and model_missing:
        raise ConfigError(f"GRPO_MODEL_ID={cfg.model_id!r}: no model directory (config.json) there")
    if _looks_local(cfg.training_dataset) and not Path(cfg.training_dataset).expanduser().exists():
        raise ConfigError(f"TRAINING_DATASET={cfg.training_dataset!r}: no such file or folder")


def _looks_local(name: str) -> bool:
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


def load_problems(source: str, warn: Callable[[str], None] = print) -> list[dict]:
    """Rows {id, problem, tests, solution, difficulty} from a hub id or a local file or folder; malformed
    rows reported, skipped. `solution` (for SFT) is None and `difficulty` "unknown" where a row has none."""
    import datasets

    datasets.disable_progress_bars()
    path = Path(source).expanduser()
    try:
        if path.is_file():
            builder = DATASET_BUILDERS.get(path.suffix)
            if builder is None:
                raise ConfigError(
                    f"TRAINING_DATASET={source!r}: expected a .jsonl, .json, .csv or .parquet file"
                )
            rows = datasets.load_dataset(builder, data_files=str(path), split="train")
        else:
            rows = datasets.load_dataset(str(path) if path.is_dir() else source, split="train")
    except ConfigError:
        raise
    except Exception as err:  # datasets raises many types; the cause is what the user needs
        cause = err.__cause__ or err
        raise ConfigError(
            f"TRAINING_DATASET={source!r}: cannot load it ({type(cause).__name__}: {cause})"
        ) from None

    problems, seen = [], set()
    for index, row in enumerate(rows):
        problem_id = row.get("id") if row.get("id") not in (None, "") else f"row {index}"
        problem_id = str(problem_id)
        problem = row.get("prompt") if row.get("prompt") is not None else row.get("problem")
        fault = _row_fault(problem, row.get("tests"), problem_id in seen)
        if fault:
            warn(f"skipped problem {problem_id}: {fault}")
            continue
        seen.add(problem_id)
        solution = row.get("solution")
        problems.append(
            {
                "id": problem_id,
                "problem": problem.strip(),
                "tests": row["tests"],
                "solution": solution if isinstance(solution, str) and solution.strip() else None,
                "difficulty": str(row.get("difficulty") or "unknown"),
            }
        )
    return problems


def _row_fault(problem: Any, tests: Any, duplicate: bool) -> str | None:
    if duplicate:
        return "duplicate id"
    if not isinstance(problem, str) or not problem.strip():
        return "no prompt (or problem) text"
    if not isinstance(tests, str) or not tests.strip():
        return "no tests"
    try:
        parse_problem(problem)  # the reward's own reading of a prompt: it needs a final `let f ... =`
    except ValueError as err:
        return str(err)
    return None


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


def build_prompt_messages(problem: str, *, min_lines: int = 8) -> list[dict]:
    """System message, the few-shot examples as earlier turns, then the problem; for the chat template."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT.format(min_lines=min_lines)}]
    for example, _tests, answer in FEW_SHOT:
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


def build_train_dataset(problems: list[dict], tokenizer, cfg: TrainConfig, note: Callable[[str], None]):
    """The rows TRL sees: chat `prompt` plus the columns the reward reads; prompts over the limit dropped."""
    from datasets import Dataset

    rows = []
    for p in problems:
        messages = build_prompt_messages(p["problem"], min_lines=cfg.min_non_empty_lines)
        if prompt_token_count(tokenizer, messages) <= cfg.max_prompt_length:
            rows.append(
                {"prompt": messages, "problem_id": p["id"], "problem": p["problem"], "tests": p["tests"]}
            )
    dropped = len(problems) - len(rows)
    note(
        f"dataset: {len(rows)} problems from {cfg.training_dataset}; {dropped} dropped as longer than "
        f"GRPO_MAX_PROMPT={cfg.max_prompt_length} tokens"
    )
    if not rows:
        raise ConfigError(
            f"GRPO_MAX_PROMPT={cfg.max_prompt_length}: no problem of {cfg.training_dataset} fits; raise it"
        )
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


def _learning_log_callback(log_path: Path, metrics_path: Path, reward_name: str):
    from transformers import TrainerCallback

    class LearningLog(TrainerCallback):
        """learning.log lines and metrics.jsonl rows from every TRL log event (main process only)."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not state.is_world_process_zero or not logs:
                return
            append_log_line(metrics_path, json.dumps({"step": state.global_step, **logs}))
            if "loss" in logs:  # the end-of-training summary has train_loss etc. instead
                append_log_line(log_path, format_log_line(logs, reward_name))

    return LearningLog()


def write_header(
    log_path: Path, cfg: TrainConfig, sources: Mapping[str, str], resume_from: str | None
) -> None:
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    what = f"resumed from {resume_from}" if resume_from else "started"
    append_log_line(log_path, f"# {started}  train.py {what}; resolved configuration:")
    for key, value in dataclasses.asdict(cfg).items():
        append_log_line(log_path, f"#   {key} = {value}  ({sources.get(key, 'default')})")


# ------------------------------------------------------------------------------------------------------------
# Model


CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_tiny_model(path: Path) -> Path:
    """A tiny randomly initialised Qwen2 model and a byte-level BPE tokenizer trained on the bundled problems.

    Built locally in about a second, no download: the demo and the tests train it end to end.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    texts = [SYSTEM_PROMPT, *(part for example in FEW_SHOT for part in example)]
    for line in BUNDLED_PROBLEMS.read_text(encoding="utf-8").splitlines():
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
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
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
        use_vllm=cfg.use_vllm,
        vllm_mode=cfg.vllm_mode,
        bf16=use_bf16,
        # Load the weights in the dtype they were saved in (bf16 for Qwen2.5) rather than TRL's float32:
        # half the memory, and generation, which runs outside autocast, at bf16 speed.
        model_init_kwargs={"dtype": "auto"},
    )


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
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    from monitor import HealthMonitor

    # GRPOConfig sets up the distributed state, so it comes before anything that asks for the main process.
    args = grpo_args(cfg, use_bf16=torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    is_main = args.process_index == 0
    log_path, metrics_path = output_dir / "learning.log", output_dir / "metrics.jsonl"
    output_dir.mkdir(parents=True, exist_ok=True)
    write_line = (lambda text: append_log_line(log_path, text)) if is_main else (lambda text: None)
    note = (lambda text: (print(text), write_line(f"# {text}"))) if is_main else write_line
    if is_main:
        write_header(log_path, cfg, sources, resume_from.name if resume_from else None)
    note(
        f"launch: distributed type: {args.distributed_state.distributed_type.value}, "
        f"processes: {args.world_size}, device: {args.device}"
    )

    problems = load_problems(cfg.training_dataset, warn=note)
    try:
        tokenizer = AutoTokenizer.from_pretrained(cfg.model_id)
    except (OSError, ValueError) as err:
        reason = " ".join(str(err).split())  # transformers' messages span lines; ours are one line
        raise ConfigError(f"GRPO_MODEL_ID={cfg.model_id!r}: cannot load its tokenizer ({reason})") from None
    dataset = build_train_dataset(problems, tokenizer, cfg, note)
    prompts_per_round = args.generation_batch_size // cfg.num_generations
    if len(dataset) < prompts_per_round:
        raise ConfigError(
            f"TRAINING_DATASET={cfg.training_dataset!r}: {len(dataset)} usable problems, but one generation "
            f"step takes {prompts_per_round}; lower GRPO_BATCH_SIZE or GRPO_GRAD_ACCUM_STEPS"
        )

    reward = SyntaxAwareReward(
        cfg, log_dir=output_dir / "reward_logs", max_completion_length=cfg.max_completion_length
    )
    try:
        trainer = GRPOTrainer(
            model=cfg.model_id,
            reward_funcs=[reward],
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=lora_config(cfg),
            # The step line first, then the monitor's WARNING/OK lines about it.
            callbacks=[
                _learning_log_callback(log_path, metrics_path, reward.__name__),
                HealthMonitor(write_line, cfg.stop_on_red_flags),
            ],
        )
        trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
        adapter_dir = output_dir / "adapter"
        trainer.save_model(str(adapter_dir))
    finally:
        reward.close()
    note(f"adapter (PEFT format) saved to {adapter_dir}")
    if merge_to and is_main:
        merge_adapter(cfg.model_id, adapter_dir, Path(merge_to))
        note(f"merged model saved to {merge_to}")
    return adapter_dir


def run_demo(cfg: TrainConfig, sources: dict[str, str], args: argparse.Namespace) -> None:
    import torch

    started = time.monotonic()
    if sources["output_dir"] == "demo" and not args.resume:
        shutil.rmtree(cfg.output_dir, ignore_errors=True)  # each `make demo` starts afresh in its own folder
    # The tiny model gains nothing from a second thread, and busy-waiting threads make it several times
    # slower when the cores are shared (CI runs other tests beside it).
    torch.set_num_threads(1)
    if sources["model_id"] == "demo" and not (Path(cfg.model_id) / "config.json").is_file():
        build_tiny_model(Path(cfg.model_id))
    adapter_dir = train(cfg, sources, resume=args.resume, merge_to=args.merge_to)
    out = Path(cfg.output_dir).resolve()
    checkpoint = latest_checkpoint(out)
    outputs = [
        ("learning.log", "one line per step in the seed's format"),
        ("metrics.jsonl", "every metric TRL logged"),
        ("reward_logs/", "completions.jsonl and syntax_aware_breakdown.jsonl"),
        (f"{checkpoint.name}/" if checkpoint else "checkpoint-*/", "the last checkpoint, for --resume"),
        (f"{adapter_dir.name}/", "the LoRA adapter in PEFT format"),
        ("tiny-model/", "the model it trained"),
    ]
    print(f"\nDemo finished in {time.monotonic() - started:.0f} s. Outputs in {out}/:")
    for name, what in outputs:
        print(f"  {name:<16} {what}")


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
        else:
            train(cfg, sources, resume=args.resume, merge_to=args.merge_to)
    except (ConfigError, ToolchainMissing) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
