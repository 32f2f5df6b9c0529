"""What a run records and shows: learning.log's lines in the seed's format, metrics.jsonl, the header of
resolved settings, the console's one line per step, and the model card of an output folder."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envflags import ConfigError
from ocaml_sandbox import ToolchainMissing
from problems import ROOT
from rewards import STAGES

if TYPE_CHECKING:
    from settings import TrainConfig


def append_log_line(path: Path | str, text: str) -> None:
    """Append one line and flush it, so that a crash or a kill loses nothing already logged."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(text.rstrip("\n") + "\n")
        f.flush()


def _num(value: Any) -> float:
    return math.nan if value is None else float(value)


NO_VALUE = "n/a"  # learning.log's and the reports' word for a metric without a value; analyze.py reads it


def figure(value: Any, spec: str) -> str:
    """`value` in the format `spec` (".3f", "+.3g"), for a log line or a report. A metric not logged,
    or logged as NaN (TRL's entropy is a mean over no tokens when dynamic sampling trains no group in a step),
    is NO_VALUE. A figure that rounds to zero prints unsigned: `-0` would read as a value below zero, and
    the sign of a float that is zero but for its last bits differs from box to box."""
    if value is None or not math.isfinite(float(value)):
        return NO_VALUE
    return format(float(value), _unsigned_zero(spec))


def _unsigned_zero(spec: str) -> str:
    """`spec` with the `z` option (Python 3.11: negative zero after rounding prints as 0), which goes after
    the fill, the alignment and the sign."""
    head = re.match(r"(.?[<>=^])?[-+ ]?", spec)
    at = head.end() if head else 0
    return spec[:at] + "z" + spec[at:]


# With dynamic sampling, the share of *sampled* groups that tied: the seed's frac_zero_std.
SAMPLED_ZERO_STD = "dynamic/frac_zero_std_sampled"


def read_jsonl(path: Path) -> list[dict]:
    """The JSON objects of a .jsonl file; a torn or foreign line (a run killed mid-write) is skipped."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def format_log_line(logs: Mapping[str, Any], reward_name: str = "syntax_aware_reward") -> str:
    """One learning.log line in the seed's format (a metric without a value prints as n/a). With dynamic
    sampling, frac_zero_std is the share of sampled groups that tied (the seed's meaning; the trained ones
    never tie) and `kept=K/N` ends the line: groups trained of groups sampled."""
    sampled = logs.get(SAMPLED_ZERO_STD)
    frac = logs.get("frac_reward_zero_std") if sampled is None else sampled
    kept = (
        f"  kept={_count(logs['dynamic/groups_trained'])}/{_count(logs['dynamic/groups_sampled'])}"
        if sampled is not None
        else ""
    )
    return (
        f"[Epoch {figure(logs.get('epoch'), '.2f')}]  loss={figure(logs.get('loss'), '.4f'):<7}  "
        f"grad={figure(logs.get('grad_norm'), '.4f')}  lr={figure(logs.get('learning_rate'), '.2e')}  "
        f"reward={_mean_std(logs, 'reward', 'reward_std')}  "
        f"syntax_rew={_mean_std(logs, f'rewards/{reward_name}/mean', f'rewards/{reward_name}/std')}  "
        f"entropy={figure(logs.get('entropy'), '.3f')}  frac_zero_std={figure(frac, '.2f')}{kept}"
    )


def _mean_std(logs: Mapping[str, Any], mean: str, std: str) -> str:
    return f"{figure(logs.get(mean), '.3f')}±{figure(logs.get(std), '.3f')}"


def _count(value: Any) -> str:
    """A group count, or its mean over a logging window of several steps."""
    number = _num(value)
    return f"{number:.0f}" if number.is_integer() else f"{number:.1f}"


def format_sft_line(logs: Mapping[str, Any]) -> str:
    """One sft/learning.log line: the loss and token accuracy on the answer tokens, of a training step or of
    the validation split (SFT_VALIDATION) after an epoch."""
    if "eval_loss" in logs:
        return (
            f"[SFT Validation Epoch {figure(logs.get('epoch'), '.2f')}]  "
            f"loss={figure(logs['eval_loss'], '.4f')}  "
            f"token_acc={figure(logs.get('eval_mean_token_accuracy'), '.3f')}"
        )
    return (
        f"[SFT Epoch {figure(logs.get('epoch'), '.2f')}]  loss={figure(logs.get('loss'), '.4f')}  "
        f"token_acc={figure(logs.get('mean_token_accuracy'), '.3f')}  "
        f"grad={figure(logs.get('grad_norm'), '.4f')}  lr={figure(logs.get('learning_rate'), '.2e')}"
    )


def format_eval_line(row: Mapping[str, Any]) -> str:
    """One learning.log line for a held-out evaluation, from its metrics.jsonl row."""
    stages = "  ".join(f"{s}={figure(row.get(f'eval/stages/{s}'), '.2f')}" for s in STAGES)
    return (
        f"[Eval Epoch {figure(row.get('epoch'), '.2f')}]  step={row['step']}  "
        f"problems={row['eval/problems']}  samples={row['eval/samples']}  pass@1={row['eval/pass@1']:.3f}  "
        f"reward={row['eval/reward']:.3f}±{row['eval/reward_std']:.3f}  {stages}"
    )


def use_step_lines(
    trainer,
    log_path: Path,
    metrics_path: Path,
    line: Callable[[Mapping[str, Any]], str],
    console_lines: int | None = None,
):
    """Replace the trainer's progress callback by one that draws the same bar with one readable line per
    logging step under it, instead of the raw metric dict; the line also goes to learning.log and every metric
    to metrics.jsonl. Only the main process writes. The end-of-training summary (train_loss, ...) goes to
    metrics.jsonl only. With `console_lines` the console shows about that many of the lines, evenly spread.
    Returns the callback: its `close_bar` ends the bar of a run that an error stops, so that the error's line
    is printed under it rather than after it on the same line."""
    from tqdm.auto import tqdm
    from transformers import ProgressCallback

    class StepLines(ProgressCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            # A console that is not a terminal (CI, tee, a log file) gets the step lines alone: a bar there
            # is a line of carriage-return frames, thousands of characters long.
            if state.is_world_process_zero:
                self.training_bar = tqdm(total=state.max_steps, dynamic_ncols=True, disable=not on_terminal())
            self.current_step = 0

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not state.is_world_process_zero or not logs:
                return
            append_log_line(metrics_path, json.dumps({"step": state.global_step, **logs}))
            if "loss" in logs or "eval_loss" in logs:
                text = line(logs)
                append_log_line(log_path, text)
                every = max(1, state.max_steps // console_lines) if console_lines else 1
                if state.global_step % every == 0 or state.global_step == state.max_steps:
                    console(text)

        def on_prediction_step(self, args, state, control, **kwargs):
            if on_terminal():  # an evaluation's bar, as the training bar: frames only where they redraw
                super().on_prediction_step(args, state, control, **kwargs)

        def close_bar(self) -> None:
            if self.training_bar is not None:
                self.training_bar.close()
                self.training_bar = None

    lines = StepLines()
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(lines)
    return lines


def on_terminal() -> bool:
    """Whether progress bars go to a terminal (tqdm draws on stderr)."""
    return sys.stderr.isatty()


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


def eval_row(step: int, epoch: float, summary: Mapping[str, Any]) -> dict:
    """The metrics.jsonl row of one evaluation (eval_stats.summarize's summary)."""
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


def as_given(value: Any, run_dir: Path) -> Any:
    """A local path as a model card names it, so that the card is right on the hub and on any other machine:
    relative to the run's folder when it is inside it (the SFT model), a file bundled with this repository by
    its name there (`data/demo_problems.jsonl`, which train.py finds from any folder), anything else relative
    to the run's folder. A hub id, and any value that is not a path, as it is."""
    if not isinstance(value, str) or not value:
        return value
    path = Path(value).expanduser()
    if not (path.is_absolute() or path.exists()):
        return value
    path, run_dir = path.resolve(), run_dir.resolve()
    if not path.is_relative_to(run_dir) and path.is_relative_to(ROOT):
        return str(path.relative_to(ROOT))
    return os.path.relpath(path, run_dir)


def model_card(
    cfg: TrainConfig, sources: Mapping[str, str], metrics_path: Path, weights: Path, *, sft: bool = False
) -> str:
    """The README.md of an output folder: what was trained from what, the settings that differ from the
    defaults, the last metrics, and how to load and merge `weights` (the adapter, or --sft's model)."""
    rows = read_jsonl(metrics_path)  # a torn last line (a killed run) skipped
    last = next((r for r in reversed(rows) if "loss" in r), {})
    last_eval = next((r for r in reversed(rows) if "eval/pass@1" in r), None)
    full_model = sft and cfg.sft_all_weights
    run_dir = Path(cfg.output_dir)
    model_id, weights = as_given(cfg.model_id, run_dir), as_given(str(weights), run_dir)
    method = "supervised fine-tuning (TRL's SFTTrainer) on reference solutions" if sft else "GRPO (TRL)"
    dataset = as_given(cfg.sft_dataset or cfg.training_dataset if sft else cfg.training_dataset, run_dir)
    changed = [
        f"| `{f.metadata['env']}` | `{as_given(getattr(cfg, f.name), run_dir)}` | {sources[f.name]} |"
        for f in dataclasses.fields(cfg)
        if "env" in f.metadata and getattr(cfg, f.name) != f.default
    ]
    metrics = [f"| {name} | {figure(last.get(key), '.4g')} |" for name, key in CARD_METRICS if key in last]
    lines = [
        "---",
        f"base_model: {model_id}",
        f"library_name: {'transformers' if full_model else 'peft'}",
        "tags: [ocaml, code, trl, grpo, sft, lora]",
        "---",
        "",
        f"# {Path(cfg.output_dir).name}: OCaml code generation",
        "",
        f"Base model `{model_id}`, trained by {method} with ocaml-grpo's train.py on `{dataset}`; every "
        "completion scored by the OCaml toolchain (END marker, type-check, compile, tests). Local paths are "
        "relative to the run's folder (GRPO_OUTPUT_DIR).",
        "",
        "## Settings that differ from the defaults",
        "",
        "| setting | value | from |",
        "|---|---|---|",
        *(changed or ["| (none) | | |"]),
        "",
        f"## Last metrics (step {last.get('step', 'n/a')}, epoch {figure(last.get('epoch'), '.2f')})",
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
            f'base = AutoModelForCausalLM.from_pretrained("{model_id}", dtype="auto")',
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


def resume_point(output_dir: str, resume: bool) -> Path | None:
    """The checkpoint `--resume` continues from (None for a fresh run); ConfigError when --resume finds none,
    or when a fresh run would overwrite an earlier run's checkpoints and mix its logs with theirs."""
    last = latest_checkpoint(Path(output_dir).expanduser())
    if resume and last is None:
        raise ConfigError(f"--resume: no checkpoint-* folder in GRPO_OUTPUT_DIR={output_dir!r}")
    if not resume and last is not None:
        raise ConfigError(
            f"GRPO_OUTPUT_DIR={output_dir!r} holds {last.name} of an earlier run: pass --resume to "
            "continue it, or choose another GRPO_OUTPUT_DIR"
        )
    return last


def latest_checkpoint(output_dir: Path) -> Path | None:
    checkpoints = [p for p in output_dir.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()]
    return max(checkpoints, key=lambda p: int(p.name.split("-")[-1]), default=None)


def exit_status(command: Callable[[], int | None]) -> int:
    """A command line's exit status: `command()`'s (0 for None), or 2 when a setting or the missing toolchain
    stops it, which is then one `error:` line on stderr however deep it was raised."""
    try:
        return command() or 0
    except (ConfigError, ToolchainMissing) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def quiet_libraries() -> None:
    """Silence library output that tells a user nothing: a progress bar per model file loaded or saved (the
    trainer's own bar stays), and the deprecation warning that TRL's own calls raise in transformers 5."""
    import warnings

    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    warnings.filterwarnings(
        "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
    )
