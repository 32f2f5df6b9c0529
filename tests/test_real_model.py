"""The real model tier: Qwen2.5-Coder-0.5B-Instruct (Q4_K_M weights, converted by `make real-model`) through
the tokenizer and chat template, the reward, `train.py --check`, two GRPO steps, evaluate.py and the run
report. Skipped, with one reason, where the converted folder is absent; `.ci/run` makes it first. What the
model did is printed after the run's summary (conftest.REAL_MODEL_FIGURES)."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from conftest import REAL_MODEL_FIGURES, check_lines, code_blocks, real_model_folder, user_environment
from problems import BUNDLED_PROBLEMS, DEMO_HELDOUT, DEMO_PROBLEMS, HELDOUT_PROBLEMS, load_problems
from rewards import END_MARKER, STAGES

pytestmark = pytest.mark.real_model

MODEL = real_model_folder()
GGUF = MODEL.parent / f"{MODEL.name}.gguf"  # make real-model keeps the GGUF file it converted
BUNDLED = (BUNDLED_PROBLEMS, HELDOUT_PROBLEMS, DEMO_PROBLEMS, DEMO_HELDOUT)
FENCE = re.compile(r"```[ \t]*(?:ocaml|ml)?[ \t]*\n(.*?)(?:```|\Z)", re.S)


def test_the_real_chat_template_fits_every_bundled_problem_into_the_prompt_budget() -> None:
    from models import load_tokenizer
    from prompts import build_prompt_messages, prompt_token_count
    from settings import TrainConfig

    tokenizer = load_tokenizer(str(MODEL))
    budget = TrainConfig().max_prompt_length
    for path in BUNDLED:
        lengths = {
            p["id"]: prompt_token_count(tokenizer, build_prompt_messages(p["problem"]))
            for p in load_problems(str(path))
        }
        longest = max(lengths, key=lengths.get)
        longest_text = f"longest {lengths[longest]} tokens ({longest})"
        REAL_MODEL_FIGURES.append(f"{path.name}: {len(lengths)} prompts, {longest_text}, budget {budget}")
        assert max(lengths.values()) <= budget, path.name


def parses(code: str) -> bool:
    """Whether OCaml's own parser accepts `code` (ocamlc, stopping after parsing)."""
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "answer.ml"
        source.write_text(code, encoding="utf-8")
        done = subprocess.run(["ocamlc", "-stop-after", "parsing", "-c", str(source)], capture_output=True)
        return done.returncode == 0


def the_models_own_code(completion: str, problem: dict) -> str:
    """What the model meant as its answer, read independently of the reward: the problem's definitions, then
    its first fenced block (else the whole text) cut at the END marker, after the signature line when the
    block holds only a body."""
    from problems import parse_problem

    fenced = FENCE.search(completion)
    code = (fenced.group(1) if fenced else completion).split(END_MARKER, 1)[0]
    parsed = parse_problem(problem["problem"])
    if not re.search(rf"^\s*let\s+(rec\s+)*{re.escape(parsed.function)}\b", code, re.M):
        code = f"{parsed.signature}\n{code}"
    return f"{parsed.types}\n{code}"


def test_real_completions_are_read_by_the_reward_as_the_model_meant_them() -> None:
    """Every completion's syntax verdict is the model's own code's: no completion is a syntax error because
    of how the reward took the code out of it, and none parses only because of that."""
    import torch

    from evaluate import sample_completions, score_samples
    from models import load_base
    from settings import TrainConfig

    problems = load_problems(str(HELDOUT_PROBLEMS))[::6]  # 8 problems of every difficulty
    cfg = TrainConfig(max_completion_length=384)
    model, tokenizer = load_base(str(MODEL))
    threads = torch.get_num_threads()
    samples = sample_completions(model, tokenizer, problems, cfg, k=1, batch_size=8, seed=0)
    torch.set_num_threads(threads)
    rows = score_samples(samples, problems, cfg)
    by_id = {p["id"]: p for p in problems}
    shares = Counter(r["stage"] for r in rows)
    REAL_MODEL_FIGURES.append(
        "stages of 8 held-out completions (384 tokens, temperature 0.9): "
        + ", ".join(f"{stage} {shares[stage]}" for stage in STAGES if shares[stage])
    )
    lost = [
        (r["problem_id"], r["stage"], r["completion"][:300])
        for r in rows
        if parses(the_models_own_code(r["completion"], by_id[r["problem_id"]])) != (r["syntax_errors"] == 0)
    ]
    assert lost == []


def test_check_passes_with_the_real_model_and_its_gguf_file(run_python, tmp_path: Path) -> None:
    for model, out in ((MODEL, tmp_path / "folder"), (GGUF, tmp_path / "gguf")):
        env = user_environment({"GRPO_MODEL_ID": str(model), "GRPO_OUTPUT_DIR": str(out)})
        done = run_python(
            "train.py", "--check", "--training-dataset", str(DEMO_PROBLEMS), env=env, timeout=600
        )
        assert done.returncode == 0, done.stdout + done.stderr
        lines = check_lines(done.stdout)
        assert lines["model"].startswith(f"ok    model: {model}: 0.63B parameters"), lines["model"]


def test_two_grpo_steps_then_the_adapter_in_evaluate_and_the_run_report(run_python, tmp_path: Path) -> None:
    out = tmp_path / "run"
    flags = [
        *("--model-id", str(MODEL), "--training-dataset", str(DEMO_PROBLEMS), "--output-dir", str(out)),
        *("--max-steps", "2", "--batch-size", "2", "--num-generations", "2", "--max-completion", "64"),
        *("--eval-steps", "none", "--report-to", "none", "--save-steps", "2"),
    ]
    done = run_python("train.py", *flags, env=user_environment(), timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [line for line in (out / "learning.log").read_text().splitlines() if line.startswith("[Epoch")]
    assert len(steps) == 2 and all("reward=" in line for line in steps), steps
    REAL_MODEL_FIGURES.extend(f"two GRPO steps (2 x 2 completions, 64 tokens): {line}" for line in steps)
    assert (out / "adapter" / "adapter_config.json").is_file()

    evaluated = tmp_path / "eval"
    env = user_environment({"GRPO_MAX_COMPLETION": "48"})
    args = [
        str(out / "adapter"),
        "--problems",
        str(DEMO_HELDOUT),
        "-n",
        "2",
        "-k",
        "1",
        "--out-dir",
        str(evaluated),
    ]
    done = run_python("evaluate.py", *args, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (evaluated / "eval_adapter.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and "Q4_K_M weights" in done.stdout

    done = run_python("analyze.py", str(out), env=user_environment(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = (out / "analysis.md").read_text(encoding="utf-8")
    sampled = [json.loads(line) for line in (out / "reward_logs" / "syntax_aware_breakdown.jsonl").open()]
    blocks = code_blocks(report)  # every block closed where it should be
    shown = [b["preview"] for b in sampled if "\n".join(b["preview"].splitlines()[:12]) in blocks]
    assert shown, "no real completion is shown whole in the report's examples"


def test_the_gguf_file_samples_what_its_converted_folder_samples(run_python, tmp_path: Path) -> None:
    """A GGUF file works as a model id, dequantized on load into the very weights make real-model saved."""
    args = [
        str(MODEL),
        str(GGUF),
        "--problems",
        str(DEMO_HELDOUT),
        "-n",
        "2",
        "-k",
        "2",
        "--out-dir",
        str(tmp_path),
    ]
    done = run_python("evaluate.py", *args, env=user_environment({"GRPO_MAX_COMPLETION": "24"}), timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    folder, gguf = (
        [
            json.loads(line)["completion"]
            for line in (tmp_path / f"eval_{name}.jsonl").read_text().splitlines()
        ]
        for name in (MODEL.name, GGUF.name)
    )
    assert folder == gguf and len(folder) == 4
