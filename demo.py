"""`python train.py --demo`: a tiny Qwen2 model and tokenizer built locally, its pinned settings, and what
the demo prints when it ends. train.py runs the demo's SFT and GRPO; this module prepares and reports."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from problems import BUNDLED_PROBLEMS, DEMO_HELDOUT, DEMO_PROBLEMS, DEMO_SFT
from prompts import FEW_SHOT, SYSTEM_PROMPT
from run_records import latest_checkpoint

if TYPE_CHECKING:
    from settings import TrainConfig

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
    "GRPO_EVAL_DATASET": str(DEMO_HELDOUT),
    "GRPO_EVAL_HOLDOUT": "0",
    "GRPO_EVAL_STEPS": "20",
    "GRPO_GENERATION": "plain",
    "GRPO_REPORT_TO": "trackio",
    "LORA_R": "16",
    "LORA_ALPHA": "32",
}
DEMO_MODEL_SHAPE = {"layers": 4, "width": 128}  # SFT takes it from random to the answers in about 30 s


CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


# The tiny tokenizer learns its merges from the first 50 problems of data/problems.jsonl, the set it was
# made with: the training set grows, the demo keeps its own data. Trained on all 316, the demo's seeds 1
# and 2 stopped learning (rewards -0.016 and -0.302 over 40 steps, bench/demo_seeds.py); on these 50 they
# rise as before.
TOKENIZER_PROBLEMS = 50


def build_tiny_model(path: Path, layers: int = 2, width: int = 64) -> Path:
    """A tiny randomly initialised Qwen2 model and a byte-level BPE tokenizer trained on the first bundled
    problems (TOKENIZER_PROBLEMS) and the demo's SFT answers.

    Built locally in about a second, no download: the demo and the tests train it end to end.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    texts = [SYSTEM_PROMPT, *(part for example in FEW_SHOT for part in example)]
    for line in (
        *BUNDLED_PROBLEMS.read_text(encoding="utf-8").splitlines()[:TOKENIZER_PROBLEMS],
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


def prepare(cfg: TrainConfig, sources: Mapping[str, str], *, resume: bool) -> None:
    """A fresh demo folder (unless resumed), one torch thread, and the tiny model built where the demo's
    settings put GRPO_MODEL_ID (unless the user gave a model)."""
    import torch

    out = Path(cfg.output_dir)
    if sources["output_dir"] == "demo" and not resume:
        shutil.rmtree(out, ignore_errors=True)  # each `make demo` starts afresh in its own folder
    # The tiny model gains nothing from a second thread, and busy-waiting threads make it several times
    # slower when the cores are shared (CI runs other tests beside it).
    torch.set_num_threads(1)
    if sources["model_id"] == "demo" and not (Path(cfg.model_id) / "config.json").is_file():
        build_tiny_model(Path(cfg.model_id), **DEMO_MODEL_SHAPE)


def print_summary(out: Path, adapter_dir: Path, bands: str, seconds: float) -> None:
    """The run report written (judged by the bands GRPO_MONITOR_BANDS names), then what the demo made and
    where, and the report's verdict."""
    import analyze
    from health_bands import PROFILES

    report, plots = analyze.write_report(analyze.load_run(out), PROFILES[bands])
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
    if (out / "trackio").is_dir():
        outputs.append(("trackio/", f"the dashboard's data: python analyze.py --dashboard {out}"))
    print(f"\nDemo finished in {seconds:.0f} s. Outputs in {out.resolve()}/:")
    for name, what in outputs:
        print(f"  {name:<16} {what}")
    print(f"\nStatus: {report.status}\nDecision: {report.decision}")
    print("Plots: " + ", ".join(str(p) for p in plots))
