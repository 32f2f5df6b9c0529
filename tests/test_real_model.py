"""The real model tier: Qwen2.5-Coder-0.5B-Instruct (Q4_K_M weights, converted by `make real-model`) through
the tokenizer and chat template, the reward, `train.py --check`, a GRPO step, evaluate.py and the run
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

    from evaluate import EVAL_CHUNK, sample_completions, score_samples
    from models import load_base
    from settings import TrainConfig

    problems = load_problems(str(HELDOUT_PROBLEMS))[::6]  # 8 problems of every difficulty
    cfg = TrainConfig(max_completion_length=384)
    model, tokenizer = load_base(str(MODEL))
    threads = torch.get_num_threads()
    samples = sample_completions(
        model, tokenizer, problems, cfg, k=1, batch_size=8, seed=0, chunk=EVAL_CHUNK
    )  # as evaluate.py samples: a runaway does not hold the finished rows to 384 tokens
    torch.set_num_threads(threads)
    rows = score_samples(samples, problems, cfg)
    by_id = {p["id"]: p for p in problems}
    shares = Counter(r["stage"] for r in rows)
    REAL_MODEL_FIGURES.append(
        "stages of 8 held-out completions (384 tokens, temperature 0.9): "
        + ", ".join(f"{stage} {shares[stage]}" for stage in STAGES if shares[stage])
    )
    # The real model writes OCaml the toolchain reads: some completions end and parse (at 256 tokens the
    # base model's held-out completions: 27% gated, 41% syntax errors, 32% parsed).
    assert shares["gated"] < len(rows) and sum(shares[s] for s in STAGES[STAGES.index("type_error") :]) >= 1
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


def test_a_grpo_step_trains_the_adapter_then_evaluate_and_the_run_report(run_python, tmp_path: Path) -> None:
    """A GRPO step of 1 prompt x 4 completions of up to 128 tokens: the real model's completions end and
    score apart there (at 2 x 2 completions of 64 tokens the groups can all tie, and then nothing is
    learned), so the adapter's LoRA B matrices, zero as PEFT starts them, are trained. One step costs about
    what the two steps of 2 x 2 completions of 64 tokens did."""
    from safetensors.torch import load_file

    out = tmp_path / "run"
    flags = [
        *("--model-id", str(MODEL), "--training-dataset", str(DEMO_PROBLEMS), "--output-dir", str(out)),
        *("--max-steps", "1", "--batch-size", "1", "--num-generations", "4", "--max-completion", "128"),
        *("--eval-steps", "none", "--report-to", "none", "--save-steps", "1"),
    ]
    done = run_python("train.py", *flags, env=user_environment(), timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [line for line in (out / "learning.log").read_text().splitlines() if line.startswith("[Epoch")]
    assert len(steps) == 1 and "reward=" in steps[0], steps
    REAL_MODEL_FIGURES.append(f"a GRPO step (1 x 4 completions, 128 tokens): {steps[0]}")
    assert "frac_zero_std=0.00" in steps[0], steps  # its group's rewards differ
    lora_b = {
        n: w for n, w in load_file(out / "adapter" / "adapter_model.safetensors").items() if "lora_B" in n
    }
    trained = [n for n, w in lora_b.items() if w.abs().max() > 0]
    assert lora_b and len(trained) == len(lora_b), f"{len(trained)} of {len(lora_b)} LoRA B matrices trained"

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


# llama.cpp's tensor names -> transformers' Qwen2 names
GGUF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output.weight": "lm_head.weight",
    "output_norm.weight": "model.norm.weight",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def transformers_name(gguf_name: str) -> str:
    if gguf_name in GGUF_NAMES:
        return GGUF_NAMES[gguf_name]
    _, layer, part, kind = gguf_name.split(".")  # blk.11.ffn_down.weight
    return f"model.layers.{layer}.{GGUF_NAMES[part]}.{kind}"


def test_the_gguf_file_loads_and_converts_into_the_weights_the_gguf_package_reads_from_it() -> None:
    """The project's GGUF load (models.load_causal_lm, dequantized to bf16) and make real-model's converted
    folder hold, for the first and last tensor of each quantization type in the file (and the untied
    output layer), what the gguf package's own reader dequantizes from the file, rounded to bf16."""
    import torch
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors import safe_open

    from models import load_causal_lm

    by_type: dict[str, list] = {}
    for tensor in GGUFReader(GGUF).tensors:
        by_type.setdefault(tensor.tensor_type.name, []).append(tensor)
    assert {"Q4_K", "Q5_0", "Q6_K", "Q8_0", "F32"} <= set(by_type), sorted(by_type)  # Q4_K_M's mix
    picked = {t.name: t for tensors in by_type.values() for t in (tensors[0], tensors[-1])}
    picked |= {t.name: t for t in by_type["Q8_0"] if t.name == "output.weight"}
    loaded = load_causal_lm(str(GGUF)).state_dict()
    with safe_open(MODEL / "model.safetensors", framework="pt") as folder:
        for name, tensor in picked.items():
            expected = torch.from_numpy(dequantize(tensor.data, tensor.tensor_type).copy()).to(torch.bfloat16)
            for source, weights in (
                ("GGUF load", loaded[transformers_name(name)]),
                ("folder", folder.get_tensor(transformers_name(name))),
            ):
                assert weights.dtype == torch.bfloat16 and torch.equal(weights, expected), (source, name)
