"""Held-out evaluation: pass@1, pass@k and reward of models or LoRA adapters under the training reward.

    python evaluate.py MODEL_OR_ADAPTER [MODEL_OR_ADAPTER ...] [--problems FILE_OR_ID] [-n N] [-k 4]
    python evaluate.py MODEL --problems nuprl/MultiPL-E:humaneval-ml --protocol multipl-e
    python evaluate.py --compare A.jsonl B.jsonl

Every model samples k completions for each problem with the training prompt and the sampling settings train.py
reads (GRPO_TEMPERATURE, GRPO_MAX_COMPLETION, MIN_NON_EMPTY_LINES... from the environment), on the same
problems and from the same random stream (`--protocol multipl-e`: MultiPL-E's own sampling instead). Problems
whose tests are broken are left out first (problem_check.py). The training reward scores every completion; a
completion succeeds when it passes every test. The script prints a summary and a per-difficulty table, and
writes every sample with its breakdown (OUT_DIR/eval_<label>.jsonl) and a markdown report
(OUT_DIR/eval_report.md). `--compare` lists the problems two such JSONL files disagree on, with the
statistics of eval_stats.py. The library functions (`sample_completions`, `score_samples`, and
eval_stats.summarize) also serve the trainer's in-training evaluation.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import envflags
from cpu_training import fast_sampling, on_cpu
from envflags import ConfigError
from eval_stats import (
    compare,
    comparison_markdown,
    comparison_totals,
    markdown_table,
    summarize,
)
from models import load_model, looks_local, weights_note
from multipl_e import MULTIPL_E, MULTIPL_E_GREEDY, Protocol, stop_at_stop_sequence
from ocaml_sandbox import check_toolchain
from problem_check import leave_out_broken
from problems import HELDOUT_PROBLEMS, bundled_path, load_problems, parse_problem
from prompts import build_prompt_messages
from rewards import STAGES, RewardConfig, reference_program, score_batch
from run_records import eval_row, exit_status, quiet_libraries
from settings import TrainConfig, round_rows

if TYPE_CHECKING:
    from transformers import GenerationConfig

# Completions decoding together. On the 2-core CPU the tiny model gains up to about this batch and no
# more (bench/eval_batching.py); a 1.5B model's cache for 32 completions of 704 + 512 tokens is about
# 1 GiB, small on any GPU.
DEFAULT_BATCH_SIZE = 32
# Tokens a batch generates between its finished rows leaving it and waiting prompts joining it
# (continuous_batching.py).
EVAL_CHUNK = 32


def pick_problems(problems: list[dict], n: int | None, seed: int) -> list[dict]:
    """All problems in file order, or n of them drawn by the seed."""
    if n is None or n >= len(problems):
        return problems
    return random.Random(seed).sample(problems, n)


# ------------------------------------------------------------------------------------------------------------
# Sampling and scoring


def end_token_ids(model, tokenizer) -> list[int]:
    """The tokens that end a completion: the tokenizer's end token and every one the model's generation
    config declares (an end-of-turn token, say), as TRL's trainer counts them."""
    declared = model.generation_config.eos_token_id
    declared = declared if isinstance(declared, list) else [declared]
    return sorted({i for i in [tokenizer.eos_token_id, *declared] if i is not None})


def sample_completions(
    model,
    tokenizer,
    problems: Sequence[dict],
    cfg: TrainConfig,
    *,
    k: int,
    batch_size: int,
    seed: int,
    progress: Callable[[int], None] | None = None,
    chunk: int | None = None,
) -> list[dict]:
    """k completions per problem as {problem_id, sample, completion, truncated, length}, problem by problem,
    from the training prompt with the run's sampling settings (generate_samples says how they are batched,
    and what `chunk` does)."""
    from transformers import GenerationConfig

    texts = {
        p["id"]: tokenizer.apply_chat_template(
            build_prompt_messages(p["problem"], few_shot=cfg.few_shot),
            tokenize=False,
            add_generation_prompt=True,
        )
        for p in problems
    }
    stop = end_token_ids(model, tokenizer)
    # TRL's sampler (top_p 1, top_k 0, no repetition penalty), not the model's chat defaults. A whole config,
    # so that the trainer's compiled sampler (generation.py), installed as the model's generate, takes it too.
    sampling = GenerationConfig(
        do_sample=True,
        temperature=cfg.temperature,
        top_p=1.0,
        top_k=0,
        repetition_penalty=1.0,
        max_new_tokens=cfg.max_completion_length,
        eos_token_id=stop,
        pad_token_id=tokenizer.pad_token_id,
    )

    def completion(ids: list[int]) -> dict:
        end = next((i + 1 for i, token in enumerate(ids) if token in stop), None)
        # No end token within max_new_tokens: the reward's truncated (runaway) completion.
        kept = ids if end is None else ids[:end]
        return {
            "completion": tokenizer.decode(kept, skip_special_tokens=True),
            "truncated": end is None,
            "length": len(kept),
        }

    wanted = [(p["id"], i, texts[p["id"]]) for p in problems for i in range(k)]
    # The chat template has written the special tokens already.
    return generate_samples(
        model,
        tokenizer,
        wanted,
        sampling,
        completion,
        batch_size=batch_size,
        seed=seed,
        special_tokens=False,
        progress=progress,
        chunk=chunk,
        ended=set(stop),  # a row that ended wrote its end token; its reader reads to it
    )


def sample_continuations(
    model,
    tokenizer,
    problems: Sequence[dict],
    *,
    k: int,
    batch_size: int,
    seed: int,
    protocol: Protocol = MULTIPL_E,
    progress: Callable[[int], None] | None = None,
    chunk: int | None = None,
) -> list[dict]:
    """k raw continuations of each prompt as {problem_id, sample, completion, truncated, length}, in
    MultiPL-E's way (multipl_e.Protocol): the prompt stripped and tokenized as plain text (no chat template),
    sampled with its temperature and top-p (greedy at temperature 0), the text cut at the first stop
    sequence. A continuation that hit max_new_tokens with no stop sequence and no end token is `truncated`."""
    from transformers import GenerationConfig

    end_ids = set(end_token_ids(model, tokenizer))
    sampled = protocol.temperature > 0
    # Every sampling value set here, none left to the model's generation_config (the hub's Qwen2.5 files
    # ask for top-k 20 and a repetition penalty of 1.1); greedy decoding gets the values that change nothing,
    # which transformers does not warn about.
    sampling = GenerationConfig(
        do_sample=sampled,
        temperature=protocol.temperature if sampled else 1.0,
        top_p=protocol.top_p if sampled else 1.0,
        top_k=0 if sampled else 50,
        repetition_penalty=1.0,
        max_new_tokens=protocol.max_new_tokens,
        eos_token_id=sorted(end_ids),
        pad_token_id=tokenizer.pad_token_id,
        stop_strings=list(protocol.stop),
    )
    # A sequence that stopped early is padded to the batch's length: its first pad token ends it.
    finished = end_ids | {tokenizer.pad_token_id}

    def continuation(ids: list[int]) -> dict:
        end = next((j for j, token in enumerate(ids) if token in finished), None)
        kept = ids if end is None else ids[:end]
        text, stopped = stop_at_stop_sequence(tokenizer.decode(kept, skip_special_tokens=True), protocol.stop)
        return {
            "completion": text,
            "truncated": end is None and not stopped and len(kept) >= protocol.max_new_tokens,
            "length": len(kept),
        }

    wanted = [(p["id"], i, p["problem"].strip()) for p in problems for i in range(k)]
    return generate_samples(
        model,
        tokenizer,
        wanted,
        sampling,
        continuation,
        batch_size=batch_size,
        seed=seed,
        progress=progress,
        chunk=chunk,
        ended=finished,
    )


def generate_samples(
    model,
    tokenizer,
    wanted: Sequence[tuple[str, int, str]],
    sampling: GenerationConfig,
    read: Callable[[list[int]], dict],
    *,
    batch_size: int,
    seed: int,
    special_tokens: bool = True,
    progress: Callable[[int], None] | None = None,
    chunk: int | None = None,
    ended: set[int] | None = None,
) -> list[dict]:
    """Each (problem_id, sample, prompt text) of `wanted` sampled once with the GenerationConfig `sampling`,
    as {problem_id, sample, **read(the completion's token ids)}, in order.

    `batch_size` prompts go through one left-padded generate call, several problems' samples together; a
    short last batch is not filled up (the compiled sampler, generation.py, pads its calls to a round
    itself). With `chunk`, `batch_size` rows decode together `chunk` tokens a call, and between calls the
    rows that have ended (a token of `ended`) leave and the prompts still waiting take their places
    (continuous_batching.py: a runaway would otherwise hold its batch's ended rows to the token limit; every
    evaluation but the trainer's under its compiled sampler, whose shapes are fixed). The same seed gives
    every model the same random stream; the caller's random state, train/eval mode and grad mode are as they
    were afterwards, so the trainer can call this on the model it is training. `progress` gets the number of
    completions sampled so far after each call.
    """
    import torch

    import packed_weights
    from continuous_batching import generate_continuously

    device = model.device
    # transformers matches stop strings through the tokenizer.
    tokenizer_for_stops = {"tokenizer": tokenizer} if sampling.stop_strings else {}

    def encode(indexes: Sequence[int]) -> Mapping:
        """The left-padded input_ids and attention_mask of the prompts of `wanted` at `indexes`."""
        return tokenizer(
            [wanted[i][2] for i in indexes],
            return_tensors="pt",
            padding=True,
            padding_side="left",
            add_special_tokens=special_tokens,
        ).to(device)

    was_training = model.training
    model.eval()  # no dropout while sampling, LoRA's included
    samples = []
    try:
        with (
            torch.random.fork_rng(devices=[device] if device.type == "cuda" else []),
            torch.no_grad(),
            packed_weights.held(),  # the CPU sampler's weight copies made once, not once a call
        ):
            torch.manual_seed(seed)

            if chunk:
                completions = generate_continuously(
                    model,
                    encode,
                    len(wanted),
                    sampling,
                    ended or set(),
                    slots=batch_size,
                    chunk=chunk,
                    progress=progress,
                    **tokenizer_for_stops,
                )
            else:
                completions = []
                for start in range(0, len(wanted), batch_size):
                    inputs = encode(range(start, min(start + batch_size, len(wanted))))
                    output = model.generate(**inputs, generation_config=sampling, **tokenizer_for_stops)
                    completions += output[:, inputs["input_ids"].shape[1] :].tolist()
                    if progress:
                        progress(len(completions))
            for (problem_id, sample, _), ids in zip(wanted, completions, strict=True):
                samples.append({"problem_id": problem_id, "sample": sample, **read(ids)})
    finally:
        model.train(was_training)
    return samples


def score_samples(samples: Sequence[dict], problems: Sequence[dict], cfg: RewardConfig) -> list[dict]:
    """Each sample with its problem's difficulty and the reward's breakdown (stage, total_reward, ...)."""
    by_id = {p["id"]: p for p in problems}
    items = [
        {**s, "problem": by_id[s["problem_id"]]["problem"], "tests": by_id[s["problem_id"]]["tests"]}
        for s in samples
    ]
    # The curriculum's last phase, its target weights: scores compare across runs and steps, whatever epoch
    # a run reached (without the curriculum, the REWARD_WEIGHT_* settings). A pass is correctness: the line
    # gate never withholds `passed`, and the END marker never decides a stage.
    scores = score_batch(items, cfg, epoch=math.inf)
    return [
        {
            "problem_id": s["problem_id"],
            "difficulty": by_id[s["problem_id"]]["difficulty"],
            **{key: s[key] for key in ("sample", "completion", "truncated", "length")},
            "passed": score["stage"] == "passed",
            **{key: value for key, value in score.items() if key not in ("problem_id", "preview")},
        }
        for s, score in zip(samples, scores, strict=True)
    ]


# sample_completions' parameters again (and `protocol`), typed and keyword-only rather than **kwargs.
def evaluate_model(
    model,
    tokenizer,
    problems: Sequence[dict],
    cfg: TrainConfig,
    *,
    k: int,
    batch_size: int,
    seed: int,
    protocol: Protocol | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[dict]:
    """Scored samples of one model, with the run's sampling and reward settings; with a MultiPL-E
    `protocol`, sampled as MultiPL-E samples (multipl_e.py) and scored by the same reward."""
    if protocol is not None:
        samples = sample_continuations(
            model,
            tokenizer,
            problems,
            k=k,
            batch_size=batch_size,
            seed=seed,
            protocol=protocol,
            progress=progress,
            chunk=EVAL_CHUNK,
        )
    else:
        samples = sample_completions(
            model,
            tokenizer,
            problems,
            cfg,
            k=k,
            batch_size=batch_size,
            seed=seed,
            progress=progress,
            chunk=EVAL_CHUNK,
        )
    return score_samples(samples, problems, cfg)


def split_held_out(
    problems: list[dict], cfg: TrainConfig, note: Callable[[str], None]
) -> tuple[list[dict], list[dict]]:
    """(training problems, held-out problems): GRPO_EVAL_DATASET's problems plus GRPO_EVAL_HOLDOUT of the
    training ones. A training problem with a held-out problem's id or function name is left out of training,
    so that the evaluation is on problems the model never trains on."""
    if cfg.eval_steps is None:
        return problems, []
    held = (
        load_problems(bundled_path(cfg.eval_dataset), warn=note, setting_name="GRPO_EVAL_DATASET")
        if cfg.eval_dataset
        else []
    )
    if held:
        held, _ = leave_out_broken(held, cfg, reference_program, note, what="GRPO_EVAL_DATASET")
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


def held_out_evaluation(problems: list[dict], tokenizer, cfg: TrainConfig, record: Callable[[dict], None]):
    """A callback that samples the policy on the held-out problems and scores them with the run's reward
    before the first step, every GRPO_EVAL_STEPS steps and at the end; `record` gets each row. Only the main
    process evaluates (the others wait for it at their next step)."""
    from transformers import TrainerCallback

    round_size = round_rows(cfg)

    class HeldOutEvaluation(TrainerCallback):
        def __init__(self) -> None:
            self.done: set[int] = set()
            self.after_log = False

        def run(self, state, model) -> None:
            if state.global_step in self.done or not state.is_world_process_zero:
                return
            self.done.add(state.global_step)
            # Batches of a training round's size, in one call each, where a compiled sampler reuses the graph
            # it has; elsewhere a finished row leaves its batch (a runaway would hold it to the token limit).
            samples = sample_completions(
                model,
                tokenizer,
                problems,
                cfg,
                k=cfg.eval_samples,
                batch_size=round_size,
                seed=cfg.seed,
                chunk=None if cfg.generation == "compiled" else EVAL_CHUNK,
            )
            summary = summarize(score_samples(samples, problems, cfg), k=cfg.eval_samples)
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


def pass_columns(k: int) -> list[str]:
    """pass@1, and pass@k beside it when k > 1."""
    return ["pass@1"] if k == 1 else ["pass@1", f"pass@{k}"]


def summary_table(summaries: dict[str, dict], k: int) -> str:
    header = ["model", *pass_columns(k), "mean reward", "reward std", "truncated", *STAGES]
    rows = [
        [
            label,
            *(f"{s[column]:.1%}" for column in pass_columns(k)),
            f"{s['mean_reward']:.3f}",
            f"{s['reward_std']:.3f}",
            f"{s['truncated']:.0%}",
            *(f"{s['stages'][stage]:.0%}" for stage in STAGES),
        ]
        for label, s in summaries.items()
    ]
    return markdown_table(header, rows)


def difficulty_table(summaries: dict[str, dict], k: int) -> str:
    header = ["model", "difficulty", "problems", *pass_columns(k), "mean reward"]
    rows = [
        [
            label,
            d,
            str(s["problems"]),
            *(f"{s[column]:.1%}" for column in pass_columns(k)),
            f"{s['mean_reward']:.3f}",
        ]
        for label, summary in summaries.items()
        for d, s in summary["difficulty"].items()
    ]
    return markdown_table(header, rows)


def read_rows(path: Path) -> list[dict]:
    """Rows of an eval_<label>.jsonl file; a missing file or a bad line raises ConfigError naming it."""
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{path}:{number}: not JSON ({err.msg})") from None
        missing = [key for key in ("problem_id", "stage", "total_reward") if key not in row]
        if missing:
            raise ConfigError(f"{path}:{number}: no {', '.join(missing)} (expected evaluate.py's output)")
        rows.append(row)
    if not rows:
        raise ConfigError(f"{path}: no rows")
    return rows


# ------------------------------------------------------------------------------------------------------------
# Models


def labels_of(specs: Sequence[str]) -> list[str]:
    """Short, file-name-safe, distinct labels: the last path part, numbered when two share it."""
    names = [re.sub(r"[^A-Za-z0-9._+-]", "_", Path(spec).name or spec) for spec in specs]
    return [name if names.count(name) == 1 else f"{name}-{i + 1}" for i, name in enumerate(names)]


# ------------------------------------------------------------------------------------------------------------
# Command line


def report(
    header: str,
    summaries: dict[str, dict],
    k: int,
    comparisons: dict[tuple[str, str], dict],
    notes: Sequence[str] = (),
) -> str:
    parts = [
        "# Held-out evaluation",
        header,
        "## Summary",
        summary_table(summaries, k),
        *(["\n".join(f"- {note}" for note in notes)] if notes else []),
        "## Per difficulty",
        difficulty_table(summaries, k),
    ]
    for (label_a, label_b), result in comparisons.items():
        parts += [f"## {label_b} against {label_a}", comparison_markdown(result, label_a, label_b)]
    return "\n\n".join(parts) + "\n"


def run_compare(path_a: Path, path_b: Path) -> None:
    result = compare(read_rows(path_a), read_rows(path_b))
    print(comparison_markdown(result, str(path_a), str(path_b)))


def sampling_progress(label: str, total: int) -> Callable[[int], None]:
    """One line on stderr whenever completions are done: completions sampled of the total, the rate, the
    time left."""
    started = time.monotonic()

    def show(done: int) -> None:
        seconds = time.monotonic() - started
        left = seconds / done * (total - done)
        print(
            f"{label}: {done}/{total} completions sampled in {duration(seconds)}, "
            f"{60 * done / seconds:.1f} per min, about {duration(left)} left",
            file=sys.stderr,
            flush=True,
        )

    return show


def duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def counting_broken(summary: dict, k: int, broken: int) -> str:
    """pass@1 (and pass@k) over every problem, the broken ones counted as failures, as MultiPL-E's own
    harness scores a problem whose tests cannot pass."""
    usable = summary["problems"]
    shares = [f"{column} {summary[column] * usable / (usable + broken):.1%}" for column in pass_columns(k)]
    return (
        f"{', '.join(shares)} with the {broken} broken problems counted as failures (of {usable + broken}, "
        "as MultiPL-E's harness scores them)"
    )


def run_evaluation(args: argparse.Namespace) -> None:
    quiet_libraries()
    cfg = envflags.from_env(TrainConfig)
    source = args.problems or str(HELDOUT_PROBLEMS)
    if not args.problems and not HELDOUT_PROBLEMS.is_file():
        raise ConfigError(f"{HELDOUT_PROBLEMS}: no held-out problems file; pass --problems FILE_OR_ID")
    if looks_local(source) and not Path(source).expanduser().exists():
        raise ConfigError(f"--problems {source}: no such file or folder")
    check_toolchain()
    problems, check = leave_out_broken(
        load_problems(source, setting_name="--problems"), cfg, reference_program
    )
    broken = len(check.broken) if args.n is None else 0  # a draw of n problems has no broken ones
    problems = pick_problems(problems, args.n, args.seed)
    if not problems:
        raise ConfigError(f"{source}: no usable problems")
    protocol = None
    if args.protocol == "multipl-e":
        protocol = MULTIPL_E_GREEDY if args.greedy else MULTIPL_E
        args.k = args.k or protocol.samples
        decoding = "greedy" if args.greedy else f"temperature {protocol.temperature}, top-p {protocol.top_p}"
        sampling = (
            f"MultiPL-E's protocol: raw prompt, {decoding}, up to {protocol.max_new_tokens} new tokens, "
            "its stop sequences"
        )
    else:
        args.k = args.k or 4
        example = "the worked example" if cfg.few_shot else "no worked example (GRPO_FEW_SHOT=0)"
        sampling = f"{example}, temperature {cfg.temperature}, up to {cfg.max_completion_length} new tokens"
    header = (
        f"{len(problems)} problems from {source} x {args.k} samples (seed {args.seed}), {sampling}, "
        f"MIN_NON_EMPTY_LINES={cfg.min_non_empty_lines} (reward only), {args.batch_size} completions "
        "decoding together"
    )
    print(header)
    out_dir = Path(args.out_dir or cfg.output_dir)
    summaries, results, notes = {}, {}, []
    for spec, label in zip(args.models, labels_of(args.models), strict=True):
        started = time.monotonic()
        model, tokenizer = load_model(spec, args.base)
        if on_cpu():  # sample as the trainer does there: a problem's samples share its prompt's forward
            from generation import PlainSampler

            PlainSampler().install(model)
        with fast_sampling(model):  # the trainer's held-out evaluation runs under its fast_kernels
            rows = evaluate_model(
                model,
                tokenizer,
                problems,
                cfg,
                k=args.k,
                batch_size=args.batch_size,
                seed=args.seed,
                protocol=protocol,
                progress=sampling_progress(label, len(problems) * args.k),
            )
        vars(model).pop("generate", None)  # PlainSampler's hold on the model: a cycle that `del` would leave
        del model  # one model in memory at a time
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"eval_{label}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        results[label], summaries[label] = rows, summarize(rows, args.k)
        print(f"{label}: {len(rows)} completions scored in {time.monotonic() - started:.1f} s -> {path}")
        if note := weights_note(spec, args.base):
            notes.append(f"{label}: {note}")
        if broken:
            notes.append(f"{label}: {counting_broken(summaries[label], args.k, broken)}")
    first, *others = results
    comparisons = {(first, label): compare(results[first], results[label]) for label in others}
    print(f"\n{summary_table(summaries, args.k)}\n\n{difficulty_table(summaries, args.k)}\n")
    for line in notes:
        print(line)
    for (label_a, label_b), result in comparisons.items():
        print(f"{label_b} against {label_a}: {comparison_totals(result)}")
    path = out_dir / "eval_report.md"
    path.write_text(report(header, summaries, args.k, comparisons, notes), encoding="utf-8")
    print(f"report: {path}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="model ids or folders, or PEFT adapter folders")
    parser.add_argument("--base", help="base model for the adapters (default: each adapter's own)")
    parser.add_argument("--problems", help=f"problems file or dataset id (default: {HELDOUT_PROBLEMS.name})")
    parser.add_argument("-n", type=int, help="evaluate n problems drawn by the seed (default: all)")
    parser.add_argument(
        "-k", type=int, help="completions sampled per problem (default 4; 20 with --protocol multipl-e)"
    )
    parser.add_argument(
        "--protocol",
        choices=("chat", "multipl-e"),
        default="chat",
        help="chat: the training prompt and sampling (default); multipl-e: MultiPL-E's own, for numbers "
        "comparable with published ones",
    )
    parser.add_argument(
        "--greedy",
        action="store_true",
        help="with --protocol multipl-e: greedy decoding, one completion per problem",
    )
    parser.add_argument("--seed", type=int, default=0, help="seeds the sampling (and the draw of -n)")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULT_BATCH_SIZE,
        help=f"completions decoding together (default {DEFAULT_BATCH_SIZE})",
    )
    parser.add_argument("--out-dir", type=Path, help="JSONL files and report (default: GRPO_OUTPUT_DIR)")
    parser.add_argument(
        "--compare",
        nargs=2,
        type=Path,
        metavar=("A", "B"),
        help="compare two eval JSONL files; loads no model",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if bool(args.models) == bool(args.compare):
        parser.error("give one or more models, or --compare A.jsonl B.jsonl")
    if min(args.n or 1, args.k or 1, args.batch_size) < 1:
        parser.error("-n, -k and --batch-size must be at least 1")
    if args.greedy and (args.protocol != "multipl-e" or (args.k or 1) != 1):
        parser.error("--greedy goes with --protocol multipl-e and one sample per problem (-k 1)")
    return exit_status(lambda: run_compare(*args.compare) if args.compare else run_evaluation(args))


if __name__ == "__main__":
    sys.exit(main())
