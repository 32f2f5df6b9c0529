"""train.py data, prompt and log line: dataset files, malformed rows, few-shot examples, the seed's format."""

import dataclasses
import json
import math
import os
from pathlib import Path

import datasets
import pytest

from envflags import ConfigError
from problems import BUNDLED_PROBLEMS, load_problems
from prompts import FEW_SHOT, build_prompt_messages, build_train_dataset, check_few_shot, prompt_token_count
from rewards import END_MARKER, RewardConfig, score_completion
from run_records import as_given, format_log_line
from settings import TrainConfig
from train import parse_config

BUNDLED = [json.loads(line) for line in BUNDLED_PROBLEMS.read_text().splitlines()]


def rows_with_faults() -> list[dict]:
    """Three good rows (one with `problem` instead of `prompt`) around three malformed ones."""
    good = [{"id": r["id"], "prompt": r["prompt"], "tests": r["tests"]} for r in BUNDLED[:3]]
    return [
        good[0],
        {"id": "no_tests", "prompt": BUNDLED[3]["prompt"], "tests": ""},
        {"id": good[1]["id"], "problem": good[1]["prompt"], "tests": good[1]["tests"]},
        {"id": "no_signature", "prompt": "(** a comment and nothing else *)", "tests": "let () = ()"},
        {"id": "", "prompt": "", "tests": "let () = ()"},
        good[2],
    ]


def write_jsonl(rows: list[dict], path: Path) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_with_datasets(rows: list[dict], path: Path) -> Path:
    # One schema for every row, as a CSV or parquet file has: missing cells are empty.
    columns = ["id", "prompt", "problem", "tests"]
    table = datasets.Dataset.from_list([{c: row.get(c) for c in columns} for row in rows])
    if path.suffix == ".csv":
        table.to_csv(str(path), index=False)
    else:
        table.to_parquet(str(path))
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet", "folder"])
def test_each_format_loads_good_rows_and_reports_malformed_ones(tmp_path: Path, suffix: str) -> None:
    rows = rows_with_faults()
    if suffix == ".jsonl":
        source = write_jsonl(rows, tmp_path / "problems.jsonl")
    elif suffix == "folder":
        write_jsonl(rows, tmp_path / "train.jsonl")
        source = tmp_path
    else:
        source = write_with_datasets(rows, tmp_path / f"problems{suffix}")
    warnings: list[str] = []
    problems = load_problems(str(source), warn=warnings.append)
    assert [p["id"] for p in problems] == [BUNDLED[0]["id"], BUNDLED[1]["id"], BUNDLED[2]["id"]]
    assert problems[1]["problem"] == BUNDLED[1]["prompt"]  # read from the `problem` column
    assert all(p["tests"] == b["tests"] for p, b in zip(problems, BUNDLED, strict=False))
    assert len(warnings) == 3
    assert warnings[0] == "skipped problem no_tests: no tests"
    assert warnings[1].startswith("skipped problem no_signature: ") and "signature" in warnings[1]
    assert warnings[2] == "skipped problem row 4: no prompt (or problem) text"


def test_bundled_problems_load_whole() -> None:
    warnings: list[str] = []
    assert len(load_problems(str(BUNDLED_PROBLEMS), warn=warnings.append)) == len(BUNDLED)
    assert warnings == []


def test_unreadable_file_is_one_config_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.jsonl"
    good = {"id": "a", "prompt": "let f () =", "tests": "let () = ()"}
    broken.write_text(json.dumps(good) + '\n{"id": "b", ')
    with pytest.raises(ConfigError, match=r"^TRAINING_DATASET='.*broken.jsonl': cannot load it") as err:
        load_problems(str(broken))
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"expected a \.jsonl, \.json, \.csv or \.parquet file"):
        load_problems(str(write_jsonl([], tmp_path / "problems.txt")))


@pytest.mark.parametrize("index", range(len(FEW_SHOT)))
def test_few_shot_answers_earn_full_marks_under_the_real_reward(index: int) -> None:
    problem, tests, answer = FEW_SHOT[index]
    result = score_completion(problem, tests, answer)
    assert result["total_reward"] == 1.0, result
    assert result["tests_passed"] == result["tests_total"] == tests.count("assert (")


def test_few_shot_setting_allows_exactly_the_examples_there_are() -> None:
    field = next(f for f in dataclasses.fields(TrainConfig) if f.name == "few_shot")
    assert field.metadata["high"] == len(FEW_SHOT)
    with pytest.raises(ConfigError, match="GRPO_FEW_SHOT"):
        parse_config(["--few-shot", str(len(FEW_SHOT) + 1), "--print-config"], {})


def test_few_shot_check_passes_at_the_defaults_and_fails_when_the_sandbox_cannot_run_it() -> None:
    check_few_shot(RewardConfig(min_non_empty_lines=20))  # the gate never costs a right answer
    with pytest.raises(ConfigError, match=r"few-shot example 'to_list' scores 0\.05 .*compiler timed out"):
        check_few_shot(RewardConfig(ocaml_compile_timeout=0.001))


def test_prompt_asks_for_what_the_reward_rewards() -> None:
    problem = BUNDLED[0]["prompt"]
    messages = build_prompt_messages(problem)
    assert [m["role"] for m in messages] == ["system", *["user", "assistant"] * len(FEW_SHOT), "user"]
    system = messages[0]["content"]
    assert END_MARKER in system and "```ocaml" in system
    assert "lines" not in system  # no length asked for: the line gate never costs a right answer
    assert messages[-1]["content"] == problem
    for answer in (m["content"] for m in messages[2:-1:2]):
        assert answer.startswith("```ocaml\n") and answer.endswith(f"{END_MARKER}\n```")


def test_over_long_prompts_are_dropped_and_counted(tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    problems = load_problems(str(BUNDLED_PROBLEMS))
    lengths = [prompt_token_count(tokenizer, build_prompt_messages(p["problem"])) for p in problems]
    limit = sorted(lengths)[len(lengths) // 2]
    cfg, _ = parse_config([], {"GRPO_MAX_PROMPT": str(limit), "TRAINING_DATASET": str(BUNDLED_PROBLEMS)})
    notes: list[str] = []
    dataset = build_train_dataset(problems, tokenizer, cfg, notes.append)
    too_long = sum(n > limit for n in lengths)
    assert 0 < too_long < len(problems)
    assert len(dataset) == len(problems) - too_long
    assert notes == [
        f"dataset: {len(dataset)} problems from {BUNDLED_PROBLEMS}; {too_long} dropped as longer than "
        f"GRPO_MAX_PROMPT={limit} tokens"
    ]
    assert set(dataset.column_names) == {"prompt", "problem_id", "problem", "tests"}
    tight, _ = parse_config([], {"GRPO_MAX_PROMPT": str(min(lengths) - 1)})
    with pytest.raises(ConfigError, match=r"no problem of .* fits"):
        build_train_dataset(problems, tokenizer, tight, notes.append)


SEED_LINES = [
    "[Epoch 0.28]  loss=-0.0469  grad=0.0838  lr=3.58e-06  reward=0.102±0.077  syntax_rew=0.102±0.078  "
    "entropy=0.155  frac_zero_std=0.00",
    "[Epoch 0.29]  loss=0.0111   grad=0.0406  lr=3.57e-06  reward=0.115±0.065  syntax_rew=0.115±0.082  "
    "entropy=0.165  frac_zero_std=0.25",
]


def metrics_of(line: str) -> dict[str, float]:
    """The TRL metrics a seed log line was printed from."""
    fields = dict(part.split("=") for part in line.split()[2:])
    reward, reward_std = map(float, fields["reward"].split("±"))
    own, own_std = map(float, fields["syntax_rew"].split("±"))
    return {
        "epoch": float(line[len("[Epoch ") : line.index("]")]),
        "loss": float(fields["loss"]),
        "grad_norm": float(fields["grad"]),
        "learning_rate": float(fields["lr"]),
        "reward": reward,
        "reward_std": reward_std,
        "rewards/syntax_aware_reward/mean": own,
        "rewards/syntax_aware_reward/std": own_std,
        "entropy": float(fields["entropy"]),
        "frac_reward_zero_std": float(fields["frac_zero_std"]),
    }


@pytest.mark.parametrize("line", SEED_LINES)
def test_log_line_is_the_seeds_format_exactly(line: str) -> None:
    assert format_log_line(metrics_of(line)) == line


@pytest.mark.parametrize("entropy", [None, math.nan], ids=["missing", "nan"])
def test_log_line_prints_n_a_for_a_metric_without_a_value_and_analyze_reads_it_as_none(entropy) -> None:
    """TRL logs no entropy, or NaN (its mean over no tokens), for a step in which dynamic sampling trained no
    group: learning.log says n/a, and analyze.py reads the line with the other metrics and no entropy."""
    import analyze

    logs = metrics_of(SEED_LINES[0])
    if entropy is None:
        del logs["entropy"]
    else:
        logs["entropy"] = entropy
    line = format_log_line(logs)
    assert "  entropy=n/a  " in line
    parsed = analyze.parse_log_line(line)
    assert parsed == {k: v for k, v in metrics_of(SEED_LINES[0]).items() if k != "entropy"}


def test_log_line_never_prints_a_negative_zero() -> None:
    logs = metrics_of(SEED_LINES[0]) | {"loss": -1e-9, "grad_norm": -0.0}  # TRL's GRPO loss near zero
    line = format_log_line(logs)
    assert "  loss=0.0000   grad=0.0000  " in line  # not -0.0000


def test_model_card_paths_name_no_folder_of_the_training_machine(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "sft" / "model").mkdir(parents=True)
    assert as_given(str(run / "sft" / "model"), run) == "sft/model"
    assert as_given(str(BUNDLED_PROBLEMS), run) == "data/problems.jsonl"
    assert as_given(str(tmp_path / "mine.jsonl"), run) == "../mine.jsonl"
    assert as_given("Qwen/Qwen2.5-Coder-1.5B-Instruct", run) == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    assert as_given(0.003, run) == 0.003


def test_the_model_card_is_written_from_metrics_with_a_torn_last_line(tmp_path: Path) -> None:
    from run_records import model_card

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "loss": 0.5, "reward": 0.25}\n{"step": 2, "lo', encoding="utf-8")
    cfg = dataclasses.replace(TrainConfig(), output_dir=str(tmp_path))
    # A run killed mid-write, then resumed: its next save writes the card from what was logged.
    card = model_card(cfg, {"output_dir": "flag"}, metrics, tmp_path / "adapter")
    assert "## Last metrics (step 1, " in card and "| mean reward | 0.25 |" in card


FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.mark.parametrize(
    "flags",
    [
        ["--training-dataset", "tests/fixtures/multipl_e_humaneval_ml.jsonl"],  # MultiPL-E's native columns
        ["--training-dataset", "nuprl/MultiPL-E:humaneval-ml"],  # its hub id: refused before any download
        ["--sft", "--sft-dataset", "data/multipl_e_solutions.jsonl"],  # our answers to its problems
        ["--check", "--training-dataset", "nuprl/MultiPL-T"],
    ],
    ids=["file", "hub-id", "sft", "check"],
)
def test_multipl_e_is_refused_as_training_data_before_any_model_loads(flags, run_python, tmp_path) -> None:
    # A hub id, unreachable here: reaching the tokenizer or the model would fail with another message.
    argv = ["train.py", *flags, "--model-id", "Qwen/not-a-model", "--output-dir", str(tmp_path / "run")]
    run = run_python(*argv, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})  # no retries
    assert run.returncode != 0
    lines = [line for line in (run.stdout + run.stderr).splitlines() if "MultiPL-E data" in line]
    assert lines, run.stdout + run.stderr
    assert "clause 4" in lines[0] and "Machine Learning Restriction" in lines[0]
    assert "--protocol multipl-e" in lines[0]
    if "--check" in flags:  # the preflight goes on to its other checks, the training data's line says it
        assert lines[0].startswith("FAIL  training data")
    else:
        assert "Qwen/not-a-model" not in run.stdout + run.stderr


def test_multipl_e_files_still_load_for_evaluation() -> None:
    problems = load_problems(str(FIXTURES / "multipl_e_humaneval_ml.jsonl"), setting_name="--problems")
    assert [p["id"] for p in problems][:1] == ["HumanEval_0_larger"]
    with pytest.raises(ConfigError, match="clause 4"):
        load_problems(str(FIXTURES / "multipl_e_humaneval_ml.jsonl"), to_train=True)
