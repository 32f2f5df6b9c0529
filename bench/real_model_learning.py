"""The learning bench: does a recipe make the real Qwen2.5-Coder-0.5B better at unseen OCaml? On the CPU.

    .venv/bin/python bench/real_model_learning.py ARM [ARM ...]  # each arm end to end, in an hour on 2 cores
    .venv/bin/python bench/real_model_learning.py --list          # the arms and the one lever each changes
    .venv/bin/python bench/real_model_learning.py --table         # results.md and the plot from results.jsonl

Needs `make real-model` (the 0.5B) and ../shared/multipl-e/humaneval-ml-even.jsonl. An arm is a set of
train.py settings over the bench's shared shape (SHARED; the recipe's arms over RECIPE too). One arm runs:
the base model's held-out evaluations (made once, then reused: the same problems, k, seed and sampling for
every arm), its --sft warm start where it has one (made once for every arm with the same SFT settings),
train.py, the trained adapter's evaluations, evaluate.py's comparison of each with the base; then its row goes
into results.jsonl and the table and the reward plot are made again.

The held-out sets, never trained on: data/heldout.jsonl (48 problems x 4 samples, seed 0, the training prompt
at temperature 0.9, up to 256 tokens) and MultiPL-E's even half (its own protocol, REPAIR_PROBLEMS=1), greedy
and sampled (4 a problem at temperature 0.2; the nine first arms have greedy only).
Every evaluation is scored by the default reward, whatever the arm trains with. Every figure comes from the
Q4_K_M weights.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eval_stats import compare, comparison_markdown, interval, summarize  # noqa: E402
from evaluate import read_rows  # noqa: E402
from health_bands import zero_std_key  # noqa: E402
from problems import BUNDLED_PROBLEMS  # noqa: E402
from real_model import MODELS  # noqa: E402
from rewards import STAGES  # noqa: E402
from stats import holm, sign_test  # noqa: E402

MODEL = MODELS["0.5b"]
RESULTS = ROOT / "bench" / "results" / "real_model"
RUNS = ROOT / "grpo_runs" / "bench-real-model"
MULTIPL_E_EVEN = ROOT.parent / "shared" / "multipl-e" / "humaneval-ml-even.jsonl"
K = 4

# What every arm shares (train.py's env variables), chosen so that an arm fits in an hour on 2 cores: one GRPO
# step of the 0.5B there costs about 15 s a completion (sampling, then the update's forward and backward over
# a 420-token prompt), and the trained adapter's two evaluations about 25 minutes. So 12 steps of 8
# completions (2 prompts x 4), 256 tokens (the base model's completions: median 104 tokens, 93% under 256),
# the default prompt (one worked example), no in-training evaluation (the bench evaluates after).
SHARED = {
    "GRPO_MODEL_ID": str(MODEL.folder),
    "TRAINING_DATASET": "data/problems.jsonl",
    "GRPO_MAX_STEPS": "12",
    "GRPO_BATCH_SIZE": "2",
    "GRPO_NUM_GENERATIONS": "4",
    "GRPO_MAX_COMPLETION": "256",
    "GRPO_EVAL_STEPS": "none",
    "GRPO_REPORT_TO": "none",
    "GRPO_SAVE_STEPS": "1000",
    "GRPO_SEED": "42",
}
# The held-out evaluation's sampling and reward: the defaults (at most 256 tokens in the arms, as they train),
# whatever the arm trains with.
HELDOUT_EVAL = {"GRPO_TEMPERATURE": "0.9"}
TRAINING_SAMPLE = 20  # problems of data/problems.jsonl drawn by seed 0: the set's difficulty in 80 samples

# The recipe's shape (issue 35: SFT on our verified solutions, then GRPO from its adapter), sized to 120
# minutes on the 2-core CPU from bench/cpu_step.py's figures (about 34 SFT tokens/s, 12.9 s a GRPO completion
# at 2 x 8 of up to 256 tokens) and the evaluations' (about 40 minutes for the three after training):
# - SFT, one epoch over the training problems less a 24-problem validation split (about 90k tokens, 45
#   minutes), its adapter chosen on the split's loss at the half-epoch and the end. Without the worked example
#   (GRPO_FEW_SHOT=0): after SFT it is redundant, and it would make every SFT row 55% longer (485 tokens
#   against 313, the median under Qwen's template).
# - GRPO, 8 steps of 2 prompts x 8 completions (bigger groups tie less often), lr 5e-5 (the one lever that
#   moved the nine arms' rewards), about 28 minutes, with the held-out set scored once a sample every 4 steps.
# - LoRA rank 8 on all seven projections: the adapter is 8.8 MB in bf16, small enough to travel with the tree.
RECIPE = {
    "GRPO_FEW_SHOT": "0",
    "GRPO_MAX_STEPS": "8",
    "GRPO_BATCH_SIZE": "2",
    "GRPO_NUM_GENERATIONS": "8",
    "GRPO_LEARNING_RATE": "5e-5",
    "GRPO_EVAL_STEPS": "4",
    "GRPO_EVAL_SAMPLES": "1",
    "LORA_R": "8",
    "LORA_ALPHA": "16",
    "SFT_VALIDATION": "24",
}
LONGER = {"GRPO_MAX_STEPS": "24", "GRPO_EVAL_STEPS": "12"}
# The comparisons named before the recipe's runs: the recipe against the base on both held-out sets, each
# judged at p < 0.05 (the goal needs both, so the pair needs no correction); every other test of the table
# is corrected together with Holm's method.
PRIMARY = ("recipe on held-out", "recipe on MultiPL-E")


@dataclass(frozen=True)
class Arm:
    lever: str  # what the arm changes, for the table
    settings: dict[str, str] = field(default_factory=dict)  # train.py's env variables over SHARED
    sft: bool = False  # `train.py --sft` on the reference solutions first, then GRPO from its adapter
    grpo: bool = True  # False: the SFT adapter is the arm's result


ARMS = {
    "control": Arm("the project's defaults (lr 5e-6, temperature 0.9, gate 8 lines)"),
    "envrc": Arm(
        "the seed's .envrc as shipped (temperature 1.1, 8 completions a prompt, lr 8e-6, 600 tokens)",
        {
            "GRPO_TEMPERATURE": "1.1",
            "GRPO_NUM_GENERATIONS": "8",
            "GRPO_BATCH_SIZE": "1",  # 8 completions a step, as every arm
            "GRPO_LEARNING_RATE": "8e-6",
            "GRPO_MAX_COMPLETION": "600",
        },
    ),
    "lora-lr": Arm("a LoRA learning rate, 10x a full fine-tune's (5e-5)", {"GRPO_LEARNING_RATE": "5e-5"}),
    "sft": Arm("SFT warm start on the reference solutions, then GRPO from its adapter", sft=True),
    "curriculum": Arm("the curriculum weights (REWARD_CURRICULUM=1)", {"REWARD_CURRICULUM": "1"}),
    "dynamic": Arm(
        "dynamic sampling, one extra round a step at most (GRPO_DYNAMIC_SAMPLING=filter)",
        {"GRPO_DYNAMIC_SAMPLING": "filter", "GRPO_DYNAMIC_MAX_ROUNDS": "1"},
    ),
    "gate-1": Arm("partial credit for short attempts (MIN_NON_EMPTY_LINES=1)", {"MIN_NON_EMPTY_LINES": "1"}),
    "syntax-credit": Arm(
        "credit for syntax errors a few edits from parsing (REWARD_SYNTAX_CREDIT=1)",
        {"REWARD_SYNTAX_CREDIT": "1"},
    ),
    "temperature": Arm("a hotter sampler (temperature 1.1)", {"GRPO_TEMPERATURE": "1.1"}),
    "group-8": Arm(
        "bigger groups (8 completions of 1 prompt a step)",
        {"GRPO_NUM_GENERATIONS": "8", "GRPO_BATCH_SIZE": "1"},
    ),
    # The levers that each raised held-out pass@4 or mean reward alone, at once.
    "together": Arm(
        "lr 5e-5, MIN_NON_EMPTY_LINES=1 and REWARD_CURRICULUM=1 together",
        {"GRPO_LEARNING_RATE": "5e-5", "MIN_NON_EMPTY_LINES": "1", "REWARD_CURRICULUM": "1"},
    ),
    # The recipe and what it is measured against (RECIPE's shape). The three with SFT share one warm start.
    "sft-only": Arm("the recipe's SFT warm start alone, no GRPO", RECIPE, sft=True, grpo=False),
    "recipe": Arm("SFT on our verified solutions, then GRPO from its adapter", RECIPE, sft=True),
    # GRPO alone keeps the worked example: without SFT the base learns the answer's form from it.
    "grpo-only": Arm("the recipe's GRPO alone, from the base model", {**RECIPE, "GRPO_FEW_SHOT": "1"}),
    # The control: the recipe trained on rewards blind to correctness (reward_control.py).
    "random-reward": Arm(
        "the recipe with each step's rewards shuffled across its completions (GRPO_REWARD_CONTROL=shuffled)",
        {**RECIPE, "GRPO_REWARD_CONTROL": "shuffled"},
        sft=True,
    ),
    # The recipe and its control at three times its GRPO steps, which the CPU step of issue 33 (3.5 s a
    # completion, from 12.9) fits in the same time; run side by side at one thread each, so that both see the
    # same machine. The held-out set scored once a sample half-way, as the recipe does every 4 of its 8 steps.
    "recipe-24": Arm("the recipe at 24 GRPO steps", {**RECIPE, **LONGER}, sft=True),
    "random-reward-24": Arm(
        "random-reward at 24 GRPO steps", {**RECIPE, **LONGER, "GRPO_REWARD_CONTROL": "shuffled"}, sft=True
    ),
}


def environment(settings: dict[str, str]) -> dict[str, str]:
    """This process's environment without the project's settings (a shell's .envrc), plus `settings`."""
    prefixes = ("GRPO_", "LORA_", "TRAINING_", "SFT_", "REWARD_", "MIN_NON_EMPTY", "OCAML_", "RUNAWAY_")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    return {**clean, **settings}


def run(args: list[str], settings: dict[str, str], log: Path) -> None:
    """A project script as a user runs it, its output appended to `log`; stops the bench when it fails."""
    with log.open("a", encoding="utf-8") as out:
        out.write(f"\n$ {' '.join(args)}\n")
        out.flush()
        done = subprocess.run(
            [sys.executable, *args], cwd=ROOT, env=environment(settings), stdout=out, stderr=subprocess.STDOUT
        )
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} exited {done.returncode}; see {log}")


def evaluates(evaluation: Path, model: Path, made_with: dict) -> bool:
    """Whether `evaluation` is an evaluation of `model`'s weights as they are (written after all of them)
    by the command and settings `made_with`, as its record (the same name, .json) says."""
    record = evaluation.with_suffix(".json")
    if not evaluation.is_file() or not record.is_file():
        return False
    if json.loads(record.read_text(encoding="utf-8")) != made_with:
        return False
    return evaluation.stat().st_mtime > max(f.stat().st_mtime for f in model.iterdir())


def evaluation(
    model: Path, name: str, into: Path, log: Path, tokens: int = 256, prompt: dict | None = None
) -> Path:
    """evaluate.py's rows for `model` on one held-out set, into/eval_NAME.jsonl:
    `heldout` (the training prompt under the `prompt` settings the model was trained with; `tokens` at
    most), `multipl_e` (MultiPL-E's protocol, greedy, repaired), `multipl_e_sampled` (the same sampled, K a
    problem at MultiPL-E's temperature 0.2), `multipl_e_published` (greedy, unrepaired: the problems as
    MultiPL-E publishes them) or `training` (a fixed sample of data/problems.jsonl, as `heldout` is made:
    how hard the training set is for a model).
    One written after every file of `model` by the same command and settings is kept, so that a stopped
    bench goes on where it stopped."""
    target = into / f"eval_{name}.jsonl"
    scratch = into / f".{name}"
    args = ["evaluate.py", str(model), "--seed", "0", "--out-dir", str(scratch)]
    if name in ("heldout", "training"):
        args += ["-k", str(K)]
        if name == "training":
            args += ["--problems", str(BUNDLED_PROBLEMS), "-n", str(TRAINING_SAMPLE)]
        settings = {**HELDOUT_EVAL, "GRPO_MAX_COMPLETION": str(tokens), **(prompt or {})}
    else:
        args += ["--problems", str(MULTIPL_E_EVEN), "--protocol", "multipl-e"]
        args += ["-k", str(K)] if name.endswith("sampled") else ["--greedy", "-k", "1"]
        settings = {"REPAIR_PROBLEMS": "0" if name.endswith("published") else "1"}
    made_with = {"command": args, "settings": settings}
    if evaluates(target, model, made_with):
        return target
    into.mkdir(parents=True, exist_ok=True)
    run(args, settings, log)
    (scratch / f"eval_{model.name}.jsonl").replace(target)
    target.with_suffix(".json").write_text(json.dumps(made_with, indent=1) + "\n", encoding="utf-8")
    shutil.rmtree(scratch)
    return target


# The held-out sets every arm is evaluated on: the file name's part, and k (samples a problem).
EVALUATIONS = {"heldout": K, "multipl_e": 1, "multipl_e_sampled": K}


def base_evaluations(log: Path) -> dict[str, Path]:
    """The base model's evaluations, made once: every arm compares with the same ones. MultiPL-E's greedy
    one is the baseline's (bench/real_model_baseline.py), whose protocol is the same."""
    paths = {
        "heldout": RESULTS / "base" / "eval_heldout.jsonl",
        "multipl_e": RESULTS / "baseline" / "0.5b" / "eval_multipl_e.jsonl",
        "multipl_e_sampled": RESULTS / "base" / "eval_multipl_e_sampled.jsonl",
    }
    return {
        name: path if path.is_file() else evaluation(MODEL.folder, name, path.parent, log)
        for name, path in paths.items()
    }


# train.py's settings that `train.py --sft` never reads: arms that differ only in these share a warm start.
GRPO_ONLY = (
    "GRPO_MAX_STEPS",
    "GRPO_BATCH_SIZE",
    "GRPO_NUM_GENERATIONS",
    "GRPO_LEARNING_RATE",
    "GRPO_EVAL_STEPS",
    "GRPO_EVAL_SAMPLES",
    "GRPO_SAVE_STEPS",
    "GRPO_REWARD_CONTROL",
    "GRPO_OUTPUT_DIR",
)


def warm_start_settings(settings: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in settings.items() if k not in GRPO_ONLY}


def warm_start(settings: dict[str, str], log: Path) -> tuple[Path, float]:
    """`train.py --sft` under `settings`, made once: arms whose settings differ only in what GRPO alone
    reads (GRPO_ONLY) share it, so that they differ only in what GRPO does. Returns its SFT folder and the
    minutes it took when it was made."""
    sft_settings = warm_start_settings(settings)
    out = (
        RUNS
        / f"warm-start-{hashlib.sha256(json.dumps(sft_settings, sort_keys=True).encode()).hexdigest()[:8]}"
    )
    made = out / "made.json"  # written once the adapter is
    if not (made.is_file() and json.loads(made.read_text(encoding="utf-8"))["settings"] == sft_settings):
        shutil.rmtree(out, ignore_errors=True)
        started = time.monotonic()
        run(["train.py", "--sft"], {**sft_settings, "GRPO_OUTPUT_DIR": str(out)}, log)
        minutes = (time.monotonic() - started) / 60
        made.write_text(json.dumps({"settings": sft_settings, "minutes": minutes}), encoding="utf-8")
    return out / "sft", json.loads(made.read_text(encoding="utf-8"))["minutes"]


def train(name: str, arm: Arm, sft: Path | None, log: Path) -> tuple[Path, Path]:
    """The arm's run (GRPO from the warm start's adapter where it has one): the run's folder and its
    adapter."""
    out = RUNS / name
    shutil.rmtree(out, ignore_errors=True)
    if sft and not arm.grpo:
        return out, sft / "adapter"
    settings = {**SHARED, **arm.settings, "GRPO_OUTPUT_DIR": str(out)}
    if sft:
        settings["GRPO_INIT_ADAPTER"] = str(sft / "adapter")
    run(["train.py"], settings, log)
    return out, out / "adapter"


def portable_adapter(adapter: Path, into: Path) -> Path:
    """The adapter as it is committed: its weights in bf16 (the base runs in bf16; half the bytes), its base
    named as `make real-model` makes it, relative to the repository (evaluate.py and `train.py
    --init-adapter` find it there from the repository root), and its model card; not the tokenizer, which
    the base has."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    weights = load_file(adapter / "adapter_model.safetensors")
    save_file({k: v.to(torch.bfloat16) for k, v in weights.items()}, into / "adapter_model.safetensors")
    config = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))
    config["base_model_name_or_path"] = repository_path(MODEL.folder)
    (into / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    card = (adapter / "README.md").read_text(encoding="utf-8")  # its tokenizer is the base's, not copied here
    tokenizer = f'AutoTokenizer.from_pretrained("{repository_path(MODEL.folder)}")'
    card = card.replace(f'AutoTokenizer.from_pretrained("{adapter.name}")', tokenizer)
    (into / "README.md").write_text(card, encoding="utf-8")
    return into


def add_evaluations_to_card(card: Path, evaluated: dict[str, dict]) -> None:
    """The model card's evaluation table: the base and the adapter on each held-out set, from the bench."""
    titles = {
        "heldout": "data/heldout.jsonl, 48 x 4, temperature 0.9, the prompt it trained on",
        "multipl_e": "MultiPL-E HumanEval-OCaml even half, greedy",
        "multipl_e_sampled": "MultiPL-E HumanEval-OCaml even half, 4 samples at temperature 0.2",
    }
    lines = [
        "## Evaluation (bench/real_model_learning.py, the 2-core CPU, Q4_K_M weights)",
        "",
        "| held-out set | base pass@1 | this adapter's pass@1 | improved / regressed (sign test p) |",
        "|---|---|---|---|",
    ]
    for name, c in evaluated.items():
        p = sign_test(len(c["improved"]), len(c["regressed"]))
        lines.append(
            f"| {titles[name]} | {c['pass@1_before']:.1%} {interval(c['pass@1_interval_before'])} | "
            f"{c['pass@1_after']:.1%} {interval(c['pass@1_interval_after'])} | "
            f"{len(c['improved'])} / {len(c['regressed'])} ({p:.2g}) |"
        )
    lines.append("\npass@1 with its 95% interval (bootstrap over problems): docs/statistics.md.")
    card.write_text(
        card.read_text(encoding="utf-8").rstrip() + "\n\n" + "\n".join(lines) + "\n", encoding="utf-8"
    )


def steps_of(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    return [r for r in rows if "loss" in r]


def repository_path(path: Path) -> str:
    return str(path.relative_to(ROOT))


def comparison(base: Path, trained: Path, k: int) -> dict:
    """Before and after on one held-out set: pass@1 with its 95% interval, pass@k, mean reward, stage
    shares, and the problems that improved and regressed (evaluate.py --compare's reading)."""
    before, after = read_rows(base), read_rows(trained)
    summaries = summarize(before, k), summarize(after, k)
    result = compare(before, after)
    return {
        **{
            f"{key}_{when}": s[key]
            for key in ("pass@1", f"pass@{k}", "mean_reward")
            for when, s in zip(("before", "after"), summaries, strict=True)
        },
        "pass@1_interval_before": list(result["interval_a"]),
        "pass@1_interval_after": list(result["interval_b"]),
        "stages_before": summaries[0]["stages"],
        "stages_after": summaries[1]["stages"],
        "improved": [p["problem_id"] for p in result["improved"]],
        "regressed": [p["problem_id"] for p in result["regressed"]],
        "unchanged": result["unchanged"],
    }


def comparisons(row: dict) -> dict:
    """The row's comparisons with the base, from the evaluation files it names."""
    return {
        name: comparison(ROOT / row[f"base_{name}"], ROOT / row[f"trained_{name}"], k)
        for name, k in EVALUATIONS.items()
        if f"trained_{name}" in row
    }


def run_arm(name: str) -> dict:
    arm = ARMS[name]
    into = RESULTS / name
    into.mkdir(parents=True, exist_ok=True)
    RUNS.mkdir(parents=True, exist_ok=True)
    log = RUNS / f"{name}.log"  # every command's output: progress, notes
    log.write_text(f"arm {name}: {arm.lever}\n", encoding="utf-8")
    base = base_evaluations(RUNS / "base.log")
    sft, sft_minutes = warm_start({**SHARED, **arm.settings}, log) if arm.sft else (None, 0.0)
    started = time.monotonic()
    out, adapter = train(name, arm, sft, log)
    if name == "recipe":  # the adapter users take, evaluated as they get it
        adapter = portable_adapter(adapter, into / "adapter")
    prompt = {k: v for k, v in arm.settings.items() if k == "GRPO_FEW_SHOT"}  # as the adapter learned on
    trained = {n: evaluation(adapter, n, into, log, prompt=prompt) for n in EVALUATIONS}
    minutes = sft_minutes + (time.monotonic() - started) / 60  # as if the warm start were the arm's own
    if arm.grpo:
        shutil.copy(out / "learning.log", into / "learning.log")
        run(["analyze.py", str(out)], {}, log)  # the run report: what the health monitor saw
        report = (out / "analysis.md").read_text(encoding="utf-8").splitlines()
        kept = [line for line in report if not line.startswith("![analysis_")]  # its plots stay with the run
        (into / "analysis.md").write_text("\n".join(kept) + "\n", encoding="utf-8")
    if sft:
        shutil.copy(sft / "learning.log", into / "sft_learning.log")
    steps = steps_of(out) if arm.grpo else []
    rewards = [s["reward"] for s in steps]
    row = {
        "arm": name,
        "lever": arm.lever,
        "settings": {
            **SHARED,
            "GRPO_MODEL_ID": repository_path(MODEL.folder),
            **arm.settings,
            **({"--sft": "1"} if arm.sft else {}),
            **({} if arm.grpo else {"GRPO_MAX_STEPS": "0"}),
        },
        **{f"base_{n}": repository_path(path) for n, path in base.items()},
        **{f"trained_{n}": repository_path(path) for n, path in trained.items()},
        "minutes": round(minutes, 1),
        "steps": len(rewards),
        "train_reward_first5": statistics.fmean(rewards[:5]) if rewards else None,
        "train_reward_last5": statistics.fmean(rewards[-5:]) if rewards else None,
        "rewards": rewards,
        # of the sampled groups, as the monitor reads it: dynamic sampling's trained ones never tie
        "mean_frac_zero_std": statistics.fmean(s[zero_std_key(steps)] for s in steps) if steps else None,
    }
    row.update(comparisons(row))
    if name == "recipe":
        add_evaluations_to_card(adapter / "README.md", {n: row[n] for n in EVALUATIONS})
    write_results([r for r in read_results() if r["arm"] != name] + [row])
    return row


def read_results() -> list[dict]:
    path = RESULTS / "results.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_results(rows: list[dict]) -> None:
    (RESULTS / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def pass_at_1(comparison: dict) -> str:
    """pass@1 before and after, each with its 95% interval, and the change in points."""
    before, after = comparison["pass@1_before"], comparison["pass@1_after"]
    return (
        f"{before:.1%} {interval(comparison['pass@1_interval_before'])} -> {after:.1%} "
        f"{interval(comparison['pass@1_interval_after'])} ({100 * (after - before):+.1f})"
    )


def points(before: float, after: float) -> str:
    return f"{before:.1%} -> {after:.1%} ({100 * (after - before):+.1f})"


SETS = {"heldout": "held-out", "multipl_e": "MultiPL-E", "multipl_e_sampled": "MultiPL-E sampled"}


def sign_tests(rows: list[dict]) -> dict[str, float]:
    """{"ARM on SET": p} for every arm and every held-out set it was evaluated on: the sign test of its
    improved against its regressed problems."""
    return {
        f"{r['arm']} on {name}": sign_test(len(r[key]["improved"]), len(r[key]["regressed"]))
        for r in rows
        for key, name in SETS.items()
        if key in r
    }


def changed(comparison: dict, p: float) -> str:
    return f"{len(comparison['improved'])} / {len(comparison['regressed'])} ({p:.2g})"


def holm_note(rows: list[dict]) -> str:
    """The primary comparisons at 0.05, and which of the other sign tests survive Holm's correction: each
    arm against one base draw."""
    tests = sign_tests(rows)
    primary = {name: tests.pop(name) for name in PRIMARY if name in tests}
    kept = [f"{name} (adjusted p {p:.2g})" for name, p in holm(tests).items() if p < 0.05]
    judged = ", ".join(f"{name} (p {p:.2g})" for name, p in primary.items())
    listed = ", ".join(kept[:-1]) + " and " + kept[-1] if len(kept) > 1 else "".join(kept)
    survivors = f"only {listed} {'stand' if len(kept) > 1 else 'stands'}" if kept else "none stands"
    named = (
        f"The primary comparisons, named before the runs: {judged}, each judged at 0.05. The other "
        if primary
        else ""
    )
    return (
        "[low, high]: pass@1's 95% interval, a bootstrap over problems. (p): the exact two-sided sign test "
        f"of the problems that improved against those that regressed (docs/statistics.md). {named}"
        f"{len(tests)} tests against one base draw: after Holm's correction (family-wise 0.05) "
        f"{survivors}."
    )


def table(rows: list[dict]) -> str:
    """results.md: one row per arm, then the sign tests' reading, then each arm's stage shares before and
    after. pass@1 with its 95% interval (bootstrap over problems)."""
    tests = sign_tests(rows)
    lines = [
        "| arm | lever | train reward, first 5 -> last 5 steps | mean frac_zero_std | held-out pass@1 (k=4) "
        "| held-out pass@4 | held-out mean reward | improved / regressed (p) | MultiPL-E pass@1 (greedy) | "
        "MultiPL-E improved / regressed (p) | MultiPL-E pass@1 (k=4, temperature 0.2) | "
        "improved / regressed (p) | minutes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        h, m = r["heldout"], r["multipl_e"]
        sampled = (
            [
                pass_at_1(r["multipl_e_sampled"]),
                changed(r["multipl_e_sampled"], tests[f"{r['arm']} on MultiPL-E sampled"]),
            ]
            if "multipl_e_sampled" in r
            else ["not measured", "not measured"]
        )
        cells = [
            r["arm"],
            r["lever"],
            f"{r['train_reward_first5']:.3f} -> {r['train_reward_last5']:.3f}" if r["rewards"] else "no GRPO",
            f"{r['mean_frac_zero_std']:.2f}" if r["rewards"] else "-",
            pass_at_1(h),
            points(h[f"pass@{K}_before"], h[f"pass@{K}_after"]),
            f"{h['mean_reward_before']:.3f} -> {h['mean_reward_after']:.3f}",
            changed(h, tests[f"{r['arm']} on held-out"]),
            pass_at_1(m),
            changed(m, tests[f"{r['arm']} on MultiPL-E"]),
            *sampled,
            f"{r['minutes']:.0f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", holm_note(rows), "", "Held-out stage shares, base -> trained:", ""]
    lines += ["| arm | " + " | ".join(STAGES) + " |", "|---|" + "---|" * len(STAGES)]
    for r in rows:
        h = r["heldout"]
        shares = (f"{h['stages_before'][s]:.0%} -> {h['stages_after'][s]:.0%}" for s in STAGES)
        lines.append(f"| {r['arm']} | " + " | ".join(shares) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict]) -> Path:
    """Each arm's training reward per step (mean of the last 3 steps)."""
    fig, ax = plt.subplots(figsize=(8, 4))
    for r in rows:
        rewards = r["rewards"]
        smooth = [statistics.fmean(rewards[max(0, i - 2) : i + 1]) for i in range(len(rewards))]
        ax.plot(range(1, len(rewards) + 1), smooth, label=r["arm"])
    ax.set(
        title="Real Qwen2.5-Coder-0.5B (Q4_K_M weights): GRPO reward per step, mean of 3",
        xlabel="GRPO step",
        ylabel="training reward",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    path = RESULTS / "reward_per_step.png"
    fig.savefig(path)
    return path


def write_comparisons(row: dict) -> None:
    """RESULTS/ARM/comparison.md: evaluate.py --compare's per-problem reading of each held-out set."""
    titles = {
        "heldout": "data/heldout.jsonl",
        "multipl_e": "MultiPL-E's even half, greedy",
        "multipl_e_sampled": "MultiPL-E's even half, sampled",
    }
    parts = [f"# {row['arm']}: {row['lever']}"]
    for name in (n for n in EVALUATIONS if f"trained_{n}" in row):
        base, trained = row[f"base_{name}"], row[f"trained_{name}"]
        result = compare(read_rows(ROOT / base), read_rows(ROOT / trained))
        parts += [f"## {titles[name]}", comparison_markdown(result, base, trained)]
    (RESULTS / row["arm"] / "comparison.md").write_text("\n\n".join(parts) + "\n", encoding="utf-8")


def write_table() -> None:
    """results.jsonl's comparisons made again from the evaluation files they name, then results.md, each
    arm's comparison.md and the plot."""
    rows = [{**r, **comparisons(r)} for r in read_results()]
    write_results(rows)
    (RESULTS / "results.md").write_text(table(rows), encoding="utf-8")
    for row in rows:
        write_comparisons(row)
    if rows:
        plot(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("arms", nargs="*", metavar="ARM", help=f"arms to run, in order: {', '.join(ARMS)}")
    parser.add_argument("--list", action="store_true", help="print the arms and exit")
    parser.add_argument("--table", action="store_true", help="write results.md and the plot, and exit")
    args = parser.parse_args()
    if args.list:
        for name, arm in ARMS.items():
            first = " (--sft first)" if arm.sft else ""
            print(f"{name}: {arm.lever}; {arm.settings or 'the shared settings'}{first}")
        return 0
    if unknown := [name for name in args.arms if name not in ARMS]:
        parser.error(f"no arm {', '.join(unknown)}; the arms: {', '.join(ARMS)}")
    if not args.table:
        if not MODEL.folder.is_dir() or not MULTIPL_E_EVEN.is_file():
            parser.error(f"needs {MODEL.folder} (make real-model) and {MULTIPL_E_EVEN}")
        for name in args.arms:
            row = run_arm(name)
            heldout = points(row["heldout"]["pass@1_before"], row["heldout"]["pass@1_after"])
            print(f"{name}: held-out pass@1 {heldout} in {row['minutes']:.0f} min", flush=True)
            write_table()
    write_table()
    print((RESULTS / "results.md").read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
