"""evaluate.py and its old front end test_base_model.py: pass@k by hand, summaries of completions scored by
the real reward, --compare on hand-made files, sampling on the tiny model and both CLIs end to end."""

import json
import math
import re
import weakref
from pathlib import Path
from unittest import mock

import pytest
import torch

import cpu_training
import envflags
import eval_stats
import evaluate
import generation
import models
import test_base_model as tbm
from problems import BUNDLED_PROBLEMS, load_problems
from rewards import END_MARKER, STAGES
from settings import TrainConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 0, 1, 0.0),
        (4, 1, 1, 0.25),
        (4, 1, 2, 1 - 3 / 6),  # 1 - C(3,2)/C(4,2)
        (5, 2, 3, 1 - 1 / 10),  # 1 - C(3,3)/C(5,3)
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
        (4, 3, 2, 1.0),  # fewer failures than draws: a draw of 2 always holds a pass
        (4, 4, 4, 1.0),
    ],
)
def test_pass_at_k_matches_hand_computed_values(n: int, c: int, k: int, expected: float) -> None:
    assert math.isclose(eval_stats.pass_at_k(n, c, k), expected)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, 1, 0), (4, 1, 5), (4, -1, 1)])
def test_pass_at_k_refuses_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match="pass@k needs"):
        eval_stats.pass_at_k(n, c, k)


@pytest.fixture(scope="module")
def bundled() -> dict[str, dict]:
    return {p["id"]: p for p in load_problems(str(BUNDLED_PROBLEMS))}


def answer(problem: dict) -> str:
    """The reference solution as a completion: the body, then the END marker."""
    return f"{problem['solution']}\n{END_MARKER}"


def test_summary_of_completions_scored_by_the_real_reward(bundled: dict[str, dict]) -> None:
    """easy: 2 of 2 pass; medium: 1 of 2 (the other a type error); hard: none (a stub, a runaway).
    pass@1 = (1 + 1/2 + 0) / 3, pass@2 = (1 + 1 + 0) / 3."""
    easy, medium, hard = bundled["count_vowels"], bundled["run_length_encode"], bundled["lcs_length"]
    samples = [
        (easy, answer(easy), False),
        (easy, answer(easy), False),
        (medium, f'\n  let _ = 1 + "one" in{answer(medium)}', False),
        (medium, answer(medium), False),
        (hard, "hello", False),
        (hard, "let lcs_length a b =\n  (", True),
    ]
    rows = evaluate.score_samples(
        [
            {"problem_id": p["id"], "sample": i % 2, "completion": text, "truncated": cut, "length": 7}
            for i, (p, text, cut) in enumerate(samples)
        ],
        [easy, medium, hard],
        envflags.from_env(TrainConfig, {}),
    )
    assert [r["stage"] for r in rows] == ["passed", "passed", "type_error", "passed", "gated", "gated"]
    assert [r["difficulty"] for r in rows] == ["easy", "easy", "medium", "medium", "hard", "hard"]
    assert rows[5]["truncated"] and "preview" not in rows[0] and rows[0]["completion"] == answer(easy)

    summary = eval_stats.summarize(rows, k=2)
    rewards = [r["total_reward"] for r in rows]
    assert summary["pass@1"] == pytest.approx(0.5) and summary["pass@2"] == pytest.approx(2 / 3)
    assert summary["mean_reward"] == pytest.approx(sum(rewards) / 6)
    assert summary["reward_std"] == pytest.approx(torch.tensor(rewards).std(correction=0).item())
    assert summary["stages"]["passed"] == 0.5 and summary["stages"]["gated"] == pytest.approx(1 / 3)
    assert summary["truncated"] == pytest.approx(1 / 6) and summary["completions"] == 6
    assert list(summary["difficulty"]) == ["easy", "medium", "hard"]
    assert summary["difficulty"]["easy"] == {"problems": 1, "pass@1": 1.0, "pass@2": 1.0, "mean_reward": 1.0}
    assert summary["difficulty"]["medium"]["pass@1"] == 0.5 and summary["difficulty"]["medium"]["pass@2"] == 1
    assert summary["difficulty"]["hard"] == {"problems": 1, "pass@1": 0.0, "pass@2": 0.0, "mean_reward": 0.0}

    table = evaluate.difficulty_table({"m": summary}, k=2)
    assert "| model | difficulty | problems | pass@1 | pass@2 | mean reward |" in table
    assert (
        "| m | easy | 1 | 100.0% | 100.0% | 1.000 |" in table
        and "| m | hard | 1 | 0.0% | 0.0% | 0.000 |" in table
    )


def row(problem_id: str, stage: str, reward: float) -> dict:
    return {"problem_id": problem_id, "difficulty": "easy", "stage": stage, "total_reward": reward}


@pytest.fixture
def two_runs(tmp_path: Path) -> tuple[Path, Path]:
    """B against A: p1 0/2 -> 2/2 passed, p2 1/2 -> 0/2, p3 no pass either way but reward 0.1 -> 0.3,
    p4 the same, p5 only in A."""
    a = [row("p1", "type_error", 0.2)] * 2 + [row("p2", "passed", 1.0), row("p2", "tests_failed", 0.5)]
    a += [row("p3", "gated", 0.1)] * 2 + [row("p4", "passed", 1.0)] * 2 + [row("p5", "gated", 0.0)]
    b = [row("p1", "passed", 1.0)] * 2 + [row("p2", "tests_failed", 0.5)] * 2
    b += [row("p3", "syntax_error", 0.3)] * 2 + [row("p4", "passed", 1.0)] * 2
    paths = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for path, rows in zip(paths, (a, b), strict=True):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return paths


def test_compare_lists_improved_and_regressed_problems_with_deltas(two_runs: tuple[Path, Path]) -> None:
    result = eval_stats.compare(*(evaluate.read_rows(path) for path in two_runs))
    improved = [(p["problem_id"], p["pass_delta"], p["reward_delta"]) for p in result["improved"]]
    assert improved == [("p1", 1.0, 0.8), ("p3", 0.0, 0.2)]
    regressed = [(p["problem_id"], p["pass_delta"], p["reward_delta"]) for p in result["regressed"]]
    assert regressed == [("p2", -0.5, -0.25)]
    assert result["unchanged"] == 1 and result["common"] == 4 and result["only_a"] == ["p5"]
    assert result["pass_a"] == pytest.approx((0 + 0.5 + 0 + 1) / 4)
    assert result["pass_b"] == pytest.approx((1 + 0 + 0 + 1) / 4)
    assert result["reward_b"] - result["reward_a"] == pytest.approx((0.8 - 0.25 + 0.2) / 4)


def test_compare_cli_prints_the_lists_and_totals(
    two_runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert evaluate.main(["--compare", *map(str, two_runs)]) == 0
    printed = capsys.readouterr().out
    totals = re.search(
        r"2 improved, 1 regressed, 1 unchanged of 4 problems; pass rate 37.5% \[(\S+)%, (\S+)%\] -> 50.0% "
        r"\[(\S+)%, (\S+)%\] \(\+12.5 points\), mean reward \S+ -> \S+ \(\S+\); sign test p = 1\.",
        printed,
    )
    assert totals, printed
    # Each 95% interval over the 4 problems holds its pass rate and stays within what a problem can score.
    low_a, high_a, low_b, high_b = map(float, totals.groups())
    assert 0 <= low_a < 37.5 < high_a <= 100 and 0 <= low_b < 50.0 < high_b <= 100
    assert "| p1 | easy | 0% | 100% | +100 pts | 0.200 | 1.000 | +0.800 |" in printed
    assert "| p2 | easy | 50% | 0% | -50 pts | 0.750 | 0.500 | -0.250 |" in printed
    assert printed.index("| p1 |") < printed.index("| p3 |") < printed.index("Regressed (1)")
    assert "in one file only: A p5; B none" in printed


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "no such file"), ("{not json\n", ":1: not JSON"), ('{"problem_id": "p"}\n', ":1: no stage")],
)
def test_compare_names_a_bad_file_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, message: str
) -> None:
    bad = tmp_path / "bad.jsonl"
    if content is not None:
        bad.write_text(content, encoding="utf-8")
    assert evaluate.main(["--compare", str(bad), str(bad)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("error: ") and err.count("\n") == 1


@pytest.fixture(scope="module")
def adapter(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LoRA adapter on the tiny model whose weights are not zero, so it changes what the model samples."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    path = tmp_path_factory.mktemp("lora") / "adapter"
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(model, lora).save_pretrained(path)
    return path


def sample(model, tokenizer, problems: list[dict], batch_size: int, seed: int = 0) -> list[dict]:
    cfg = TrainConfig(temperature=0.9, max_completion_length=8)
    return evaluate.sample_completions(model, tokenizer, problems, cfg, k=2, batch_size=batch_size, seed=seed)


def test_batched_and_one_at_a_time_sampling_give_the_same_rows(
    tiny_model: Path, bundled: dict[str, dict]
) -> None:
    model, tokenizer = models.load_base(str(tiny_model))
    problems = [bundled["count_vowels"], bundled["lcs_length"], bundled["json_to_string"]]
    one_at_a_time, batched = sample(model, tokenizer, problems, 1), sample(model, tokenizer, problems, 5)
    for rows in (one_at_a_time, batched):
        assert [(r["problem_id"], r["sample"]) for r in rows] == [
            (p["id"], i) for p in problems for i in (0, 1)
        ]
        assert all(set(r) == {"problem_id", "sample", "completion", "truncated", "length"} for r in rows)
        assert all(r["length"] == 8 for r in rows if r["truncated"])
        assert all(1 <= r["length"] <= 8 for r in rows)
    assert sample(model, tokenizer, problems, 5) == batched  # the seed fixes the stream
    assert sample(model, tokenizer, problems, 5, seed=1) != batched


def test_sampling_a_training_peft_model_leaves_its_state_alone(tiny_model: Path) -> None:
    from peft import LoraConfig, get_peft_model

    model, tokenizer = models.load_base(str(tiny_model))
    model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"], lora_dropout=0.5)).train()
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    rng = torch.get_rng_state()
    rows = sample(model, tokenizer, [load_problems(str(BUNDLED_PROBLEMS))[0]], 2)
    assert len(rows) == 2 and model.training and torch.is_grad_enabled()
    assert [name for name, p in model.named_parameters() if p.requires_grad] == trainable
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in model.parameters())


def test_plain_sampling_generates_only_the_rows_asked_for(tiny_model: Path, bundled: dict[str, dict]) -> None:
    model, tokenizer = models.load_base(str(tiny_model))
    rows_per_call: list[int] = []
    generate = model.generate

    def counted(**kwargs):  # the model's own generate, its rows counted
        rows_per_call.append(kwargs["input_ids"].shape[0])
        return generate(**kwargs)

    model.generate = counted
    problems = [bundled["count_vowels"], bundled["lcs_length"], bundled["json_to_string"]]
    assert len(sample(model, tokenizer, problems, batch_size=4)) == 6
    assert rows_per_call == [4, 2]  # no repeats to fill the last call up


@pytest.mark.parametrize(("generation", "tokens_per_call"), [("plain", [1, 32, 7]), ("compiled", [40])])
def test_the_trainers_evaluation_lets_finished_rows_go_unless_its_sampler_is_compiled(
    tiny_model: Path, bundled: dict[str, dict], generation: str, tokens_per_call: list[int]
) -> None:
    """The held-out callback samples in chunks of EVAL_CHUNK tokens (a row that ended leaves its batch, the
    prompts waiting join it: the prompt and a first token, then the chunks), but in one call a batch where
    the compiled sampler's graph has a fixed shape. The tiny random model runs away, so a chunked batch
    runs to its 40-token limit."""
    from types import SimpleNamespace

    model, tokenizer = models.load_base(str(tiny_model))
    tokens: list[int] = []
    generate = model.generate

    def counted(**kwargs):
        tokens.append(kwargs["generation_config"].max_new_tokens)
        return generate(**kwargs)

    model.generate = counted
    cfg = TrainConfig(temperature=0.9, max_completion_length=40, eval_samples=1, generation=generation)
    rows: list[dict] = []
    callback = evaluate.held_out_evaluation([bundled["count_vowels"]], tokenizer, cfg, rows.append)
    callback.run(SimpleNamespace(global_step=0, epoch=0.0, is_world_process_zero=True), model)
    assert len(rows) == 1 and tokens == tokens_per_call


def test_a_short_last_batch_samples_through_the_compiled_samplers_one_graph(
    tiny_model: Path, bundled: dict[str, dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Six completions in batches of a four-row round: the last call has two rows, which the compiled sampler
    pads to the round itself (evaluate.py adds no rows), so the evaluation compiles one graph. On the CPU on
    any box (load_base picks the GPU where torch sees one): the GPU layer's run evaluates on CUDA."""
    from peft import LoraConfig, get_peft_model

    from generation import CompiledSampler

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    torch._dynamo.reset()  # this test's compile is counted on its own
    model, tokenizer = models.load_base(str(tiny_model))
    model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"]))
    lines: list[str] = []
    sampler = CompiledSampler(2048, 4, log=lines.append)
    sampler.install(model)
    problems = [bundled["count_vowels"], bundled["lcs_length"], bundled["json_to_string"]]
    rows = sample(model, tokenizer, problems, batch_size=4)
    assert [(r["problem_id"], r["sample"]) for r in rows] == [(p["id"], i) for p in problems for i in (0, 1)]
    assert sampler.calls == 2 and sampler.compiles == 1
    assert lines[1].startswith("sampling compiled: 1 graph(s) for 4 sequences x 2056 cache positions")


def test_cli_scores_a_model_and_an_adapter_and_writes_the_report(
    tiny_model: Path,
    adapter: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("GRPO_MAX_COMPLETION", "16")
    argv = [str(tiny_model), str(adapter), "--problems", str(BUNDLED_PROBLEMS), "-n", "3", "-k", "2"]
    loaded = []

    def load_model(spec, base):
        model, tokenizer = models.load_model(spec, base)
        loaded.append(weakref.ref(model))
        return model, tokenizer

    monkeypatch.setattr(evaluate, "load_model", load_model)
    with mock.patch.object(generation, "shared_prompt_cache", wraps=generation.shared_prompt_cache) as shared:
        assert evaluate.main([*argv, "--seed", "1", "--batch-size", "4", "--out-dir", str(tmp_path)]) == 0
    # On the CPU each batch (4 and 2 rows, a problem's 2 samples together) ran its prompts once, per model.
    assert shared.call_count == (4 if cpu_training.on_cpu() else 0)
    shared.reset_mock()  # its record of the calls holds the models
    assert len(loaded) == 2 and all(ref() is None for ref in loaded)  # each freed after its evaluation
    printed = capsys.readouterr().out
    base, tuned = (
        [json.loads(line) for line in (tmp_path / f"eval_{name}.jsonl").open()]
        for name in ("model", "adapter")
    )
    assert [(r["problem_id"], r["sample"]) for r in base] == [(r["problem_id"], r["sample"]) for r in tuned]
    assert len(base) == 6 and len({r["problem_id"] for r in base}) == 3
    assert [r["completion"] for r in base] != [r["completion"] for r in tuned]
    assert all(r["stage"] in STAGES and 0.0 <= r["total_reward"] <= 1.0 and r["difficulty"] for r in base)
    assert "| model | pass@1 | pass@2 | mean reward | reward std | truncated | gated |" in printed
    assert "| model | difficulty | problems | pass@1 | pass@2 | mean reward |" in printed
    assert "adapter against model: " in printed and " of 3 problems; pass rate " in printed
    report = (tmp_path / "eval_report.md").read_text(encoding="utf-8")
    for section in ("# Held-out evaluation", "## Summary", "## Per difficulty", "## adapter against model"):
        assert f"\n{section}\n" in f"\n{report}"
    assert "3 problems from" in report
    assert "the worked example, temperature 0.9, up to 16 new tokens" in report


def test_cli_names_what_is_missing_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(evaluate, "HELDOUT_PROBLEMS", tmp_path / "heldout.jsonl")
    assert evaluate.main([str(tmp_path / "model")]) == 2
    assert (
        capsys.readouterr().err
        == f"error: {tmp_path / 'heldout.jsonl'}: no held-out problems file; pass --problems FILE_OR_ID\n"
    )
    assert evaluate.main([str(tmp_path / "model"), "--problems", "nowhere/held.jsonl"]) == 2
    assert capsys.readouterr().err == "error: --problems nowhere/held.jsonl: no such file or folder\n"
    argv = [str(tmp_path / "no-model"), "--problems", str(BUNDLED_PROBLEMS), "--out-dir", str(tmp_path)]
    assert evaluate.main(argv) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'no-model'}: no such model folder or file\n"


# ------------------------------------------------------------------------------------------------------------
# test_base_model.py, the seed's option B, now a front end over evaluate.py


def test_decision_follows_the_seeds_twenty_percent_rule() -> None:
    weak = tbm.decision("base", {"pass@1": 0.15})
    assert "under 20%" in weak
    for remedy in ("stronger base model", "easier subset", "more few-shot examples"):
        assert remedy in weak
    assert "can learn" in tbm.decision("base", {"pass@1": 0.2})


def test_same_seed_same_problems() -> None:
    problems = [{"id": str(i)} for i in range(50)]
    assert evaluate.pick_problems(problems, 10, seed=3) == evaluate.pick_problems(problems, 10, seed=3)
    assert evaluate.pick_problems(problems, 10, seed=3) != evaluate.pick_problems(problems, 10, seed=4)
    assert evaluate.pick_problems(problems[:4], 10, seed=0) == problems[:4]
    assert evaluate.pick_problems(problems, None, seed=0) == problems


# The fixtures of the new CLI's test above: pytest passes each by its parameter's name.
def test_old_cli_compares_base_and_adapter_on_the_tiny_model(
    tiny_model: Path,
    adapter: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("GRPO_MAX_COMPLETION", "16")
    out = tmp_path / "eval.jsonl"
    argv = ["--model", str(tiny_model), "--adapter", str(adapter), "--problems", str(BUNDLED_PROBLEMS)]
    assert tbm.main([*argv, "-n", "2", "-k", "3", "--seed", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["model"] for r in rows] == ["base"] * 6 + ["base+adapter"] * 6
    assert {r["problem_id"] for r in rows[:6]} == {r["problem_id"] for r in rows[6:]} and len(rows[0]) > 5
    assert all(r["stage"] in STAGES and 0.0 <= r["total_reward"] <= 1.0 for r in rows)
    assert [r["completion"] for r in rows[:6]] != [r["completion"] for r in rows[6:]]
    assert "| model | pass@1 | pass@3 | mean reward |" in printed
    assert "| base | " in printed and "| base+adapter | " in printed
    assert "under 20%" in printed and "adapter effect: pass@1 +0.0 points" in printed


def test_old_cli_names_a_bad_adapter(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--model", str(tiny_model), "--adapter", str(tmp_path), "--problems", str(BUNDLED_PROBLEMS)]
    assert tbm.main([*argv, "-n", "1", "-k", "1", "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "no adapter_config.json" in capsys.readouterr().err
