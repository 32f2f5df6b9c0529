"""analyze.py on run folders written here: healthy, the seed's own log, collapsed, too few steps, resumed,
with held-out evaluations. The logs are written with train.py's own formatters so the formats cannot drift."""

import json
import math
import random
import re
from collections.abc import Sequence
from pathlib import Path

import matplotlib.image
import pytest

import analyze
from conftest import code_blocks
from health_bands import RELATIVE, SEED, Profile
from rewards import STAGES
from run_records import append_log_line, format_eval_line, format_log_line, write_header
from settings import TrainConfig

SEED_LOG = """\
[Epoch 0.28]  loss=-0.0469  grad=0.0838  lr=3.58e-06  reward=0.102Â±0.077  syntax_rew=0.102Â±0.078  entropy=0.155  frac_zero_std=0.00
[Epoch 0.28]  loss=-0.0333  grad=0.0362  lr=3.58e-06  reward=0.066Â±0.072  syntax_rew=0.066Â±0.069  entropy=0.090  frac_zero_std=0.00
[Epoch 0.29]  loss=0.0111   grad=0.0406  lr=3.57e-06  reward=0.115Â±0.065  syntax_rew=0.115Â±0.082  entropy=0.165  frac_zero_std=0.25
[Epoch 0.29]  loss=-0.0210  grad=0.0317  lr=3.57e-06  reward=0.084Â±0.063  syntax_rew=0.084Â±0.075  entropy=0.078  frac_zero_std=0.25
[Epoch 0.29]  loss=-0.0269  grad=0.0286  lr=3.56e-06  reward=0.073Â±0.044  syntax_rew=0.073Â±0.063  entropy=0.103  frac_zero_std=0.50
[Epoch 0.29]  loss=-0.0109  grad=0.0380  lr=3.55e-06  reward=0.113Â±0.066  syntax_rew=0.113Â±0.084  entropy=0.110  frac_zero_std=0.25
"""  # noqa: E501 (the seed's lines, verbatim)
SEED_KNOBS = [
    "GRPO_TEMPERATURE=1.1",
    "GRPO_NUM_GENERATIONS=8",
    "GRPO_LEARNING_RATE=8e-6",
    "GRPO_MAX_COMPLETION=600",
]
HEADER = "# 2025-12-10 10:00:00  train.py started; resolved configuration:\n#   temperature = {t}  (env)\n"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def metrics_row(
    step: int, epoch: float, reward: float, frac: float, entropy: float, rng: random.Random
) -> dict:
    """One TRL log event as train.py writes it to metrics.jsonl."""
    return {
        "step": step,
        "epoch": epoch,
        "loss": rng.uniform(-0.05, 0.05),
        "grad_norm": rng.uniform(0.03, 0.08),
        "learning_rate": 5e-6,
        "reward": reward,
        "reward_std": 0.2 * reward,
        "rewards/syntax_aware_reward/mean": reward,
        "rewards/syntax_aware_reward/std": 0.2 * reward,
        "entropy": entropy,
        "frac_reward_zero_std": frac,
        "completions/clipped_ratio": 0.02,
    }


def metrics_rows(steps: int, end: float, reward, frac, entropy=lambda e: 0.15, seed: int = 0) -> list[dict]:
    """TRL-named metrics for `steps` logging steps up to epoch `end`, with a little seeded noise."""
    rng = random.Random(seed)
    rows = []
    for i in range(1, steps + 1):
        e = end * i / steps
        r = max(reward(e) + rng.uniform(-0.01, 0.01), 0.0)
        rows.append(metrics_row(i, e, r, frac(e), entropy(e) + rng.uniform(-0.01, 0.01), rng))
    return rows


def eval_row(step: int, epoch: float, pass1: float, reward: float) -> dict:
    """One held-out evaluation as train.py writes it to metrics.jsonl."""
    stages = {f"eval/stages/{s}": 0.0 for s in STAGES} | {"eval/stages/passed": pass1}
    stages["eval/stages/tests_failed"] = 1.0 - pass1
    return {
        "step": step,
        "epoch": epoch,
        "eval/problems": 40,
        "eval/samples": 1,
        "eval/pass@1": pass1,
        "eval/reward": reward,
        "eval/reward_std": 0.1,
        **stages,
    }


def append_process(
    folder: Path, rows: list[dict], evals: Sequence[dict] = (), resume_from: str | None = None, every: int = 1
) -> None:
    """What one train.py process appends: its header, then per logged step the learning.log line and the
    metrics.jsonl row, with an eval line and row where an evaluation falls, and monitor lines between."""
    folder.mkdir(parents=True, exist_ok=True)
    log, metrics = folder / "learning.log", folder / "metrics.jsonl"
    write_header(log, TrainConfig(logging_steps=every), {"logging_steps": "env"}, resume_from)
    append_log_line(log, "# launch: distributed type: NO, processes: 1, device: cpu")
    at_step = {e["step"]: e for e in evals}
    for r in rows:
        append_log_line(log, format_log_line(r))
        append_log_line(metrics, json.dumps(r))
        if r["step"] in at_step:
            append_log_line(log, format_eval_line(at_step[r["step"]]))
            append_log_line(metrics, json.dumps(at_step[r["step"]]))
    append_log_line(log, "WARNING [Epoch 0.30] frac_zero_std=0.5 over the last 10 steps (expected < 0.10)")


def write_run(folder: Path, rows: list[dict], *, metrics: bool = True, header: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = [header.rstrip("\n")] if header else []
    (folder / "learning.log").write_text(
        "\n".join(lines + [format_log_line(r) for r in rows]) + "\n", encoding="utf-8"
    )
    if metrics:
        summary = {"train_runtime": 12.0, "train_loss": 0.0, "epoch": rows[-1]["epoch"]}
        text = "".join(json.dumps(r) + "\n" for r in [*rows, summary])
        (folder / "metrics.jsonl").write_text(
            text + '{"step": 99, "loss": 0.1', encoding="utf-8"
        )  # torn tail
    return folder


def write_reward_logs(folder: Path, breakdowns: list[dict]) -> None:
    logs = folder / "reward_logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / "syntax_aware_breakdown.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(b) + "\n" for b in breakdowns)
    with open(logs / "completions.jsonl", "w", encoding="utf-8") as f:
        f.writelines(
            json.dumps(
                {"problem_id": b["problem_id"], "reward": b["total_reward"], "completion": b["preview"]}
            )
            + "\n"
            for b in breakdowns
        )


def breakdown(stage: str, i: int, preview: str, error: str = "", passed: int = 0) -> dict:
    return {
        "problem_id": f"p{i}",
        "total_reward": 1.0 if stage == "passed" else 0.0,
        "stage": stage,
        "reason": f"{stage} reason",
        "error_sample": error,
        "tests_passed": passed,
        "tests_total": 3,
        "runaway_penalty_applied": False,
        "preview": preview,
    }


def healthy(folder: Path) -> Path:
    rows = metrics_rows(60, 1.0, reward=lambda e: 0.05 + 0.5 * e, frac=lambda e: round(0.5 * (1 - e) ** 3, 2))
    return write_run(folder, rows)


def collapsed(folder: Path, metrics: bool = True) -> Path:
    rows = metrics_rows(60, 1.0, reward=lambda e: 0.08, frac=lambda e: 0.5, entropy=lambda e: 0.06)
    return write_run(folder, rows, metrics=metrics)


def report(folder: Path, profile: Profile = RELATIVE) -> analyze.Analysis:
    return analyze.analyze(analyze.load_run(folder), profile)


def test_parses_the_seed_lines_in_either_encoding_and_skips_the_rest() -> None:
    for text in (SEED_LOG, SEED_LOG.replace("Â±", "±")):
        rows = [analyze.parse_log_line(line) for line in text.splitlines()]
        assert rows[0] == {
            "epoch": 0.28,
            "loss": -0.0469,
            "grad_norm": 0.0838,
            "learning_rate": 3.58e-06,
            "reward": 0.102,
            "reward_std": 0.077,
            "rewards/syntax_aware_reward/mean": 0.102,
            "rewards/syntax_aware_reward/std": 0.078,
            "entropy": 0.155,
            "frac_reward_zero_std": 0.0,
        }
        assert rows[2]["loss"] == 0.0111 and rows[4]["frac_reward_zero_std"] == 0.5
    for other in (
        "# 2025-12-10 train.py started",
        "WARNING [Epoch 0.29] frac_zero_std=0.208 over the last 6 steps (expected < 0.10)",
        "[Epoch 0.29]  loss=0.1  grad=nan  lr=1e-6",  # no reward: nothing to judge
        "[Epoch x]  reward=0.1±0.0",
        "",
    ):
        assert analyze.parse_log_line(other) is None


@pytest.mark.parametrize("text", [SEED_LOG, SEED_LOG.replace("Â±", "±")], ids=["mis-decoded", "utf-8"])
def test_the_seeds_situation_is_yellow_adjust_with_the_seeds_knobs(tmp_path: Path, text: str) -> None:
    log = tmp_path / "learning.log"
    log.write_text("# header\nsome line we do not know\n" + text, encoding="utf-8")
    result = report(log, SEED)
    assert (result.status, result.decision) == ("yellow", "adjust")
    assert result.markdown.startswith("Status: yellow\nDecision: adjust\n")
    for knob in SEED_KNOBS:
        assert f"export {knob}  #" in result.markdown
    for issue in ("Mode collapse", "Low absolute reward", "High reward variance", "Unstable entropy"):
        assert issue in result.markdown
    assert "| frac_zero_std | 0 - 0.5 | < 0.10 | WARNING: frac_zero_std 0.208 |" in result.markdown
    assert "## What to check at epoch 0.5" in result.markdown
    assert "they apply from epoch 1.0; now 0.29" in result.markdown
    assert (
        "Judged by the seed bands (GRPO_MONITOR_BANDS=seed): the seed analysis's absolute" in result.markdown
    )
    assert "## Recommended actions (seed bands)" in result.markdown
    # Six steps that hold their own first five's levels: the relative bands see no change to judge.
    relative = report(log)
    assert (relative.status, relative.decision) == ("green", "continue"), relative.markdown
    assert "| frac_zero_std | 0 - 0.5 | <= its first 5 steps + 0.30 | ok |" in relative.markdown


def test_a_run_that_climbs_while_frac_zero_std_falls_is_green(tmp_path: Path) -> None:
    result = report(healthy(tmp_path))
    assert (result.status, result.decision) == ("green", "continue"), result.markdown
    assert "**Healthy.**" in result.markdown and "export " not in result.markdown
    assert "60 logged steps with rewards, from metrics.jsonl" in result.markdown


@pytest.mark.parametrize("metrics", [True, False], ids=["metrics.jsonl", "learning.log"])
def test_steps_without_an_entropy_are_left_out_not_read_as_a_collapse(tmp_path: Path, metrics: bool) -> None:
    """Steps in which dynamic sampling trained no group: TRL logs the entropy as NaN, learning.log says
    entropy=n/a; from either file the report judges the entropy of the other steps, and finds it healthy."""
    rows = metrics_rows(60, 1.0, reward=lambda e: 0.05 + 0.5 * e, frac=lambda e: round(0.5 * (1 - e) ** 3, 2))
    for r in rows[::4]:
        r["entropy"] = math.nan
    folder = write_run(tmp_path, rows, metrics=metrics)
    assert "  entropy=n/a  " in (folder / "learning.log").read_text(encoding="utf-8")
    run = analyze.load_run(folder)
    assert len(run.history) == 60 and sum("entropy" in r for r in run.history) == 45
    result = analyze.analyze(run)
    assert (result.status, result.decision) == ("green", "continue"), result.markdown
    assert "Unstable entropy" not in result.markdown and "nan" not in result.markdown


def test_a_run_still_collapsed_at_epoch_one_is_red_stop_by_the_seed_bands(tmp_path: Path) -> None:
    for folder, metrics in ((tmp_path / "a", True), (tmp_path / "b", False)):
        result = report(collapsed(folder, metrics), SEED)
        assert (result.status, result.decision) == ("red", "stop")
        assert "**Stop.**" in result.markdown and "export REWARD_CURRICULUM=1" in result.markdown
        assert "| mean reward < 0.15 | YES |" in result.markdown
        assert "| frac_zero_std > 0.3 | YES |" in result.markdown


def test_too_few_steps_says_so(tmp_path: Path) -> None:
    log = tmp_path / "learning.log"
    log.write_text("".join(SEED_LOG.splitlines(keepends=True)[:3]), encoding="utf-8")
    result = report(tmp_path)
    assert result.markdown.startswith("Status: yellow\nDecision: continue\n")
    assert "Too few steps to judge: 3 logged step(s), at least 5 needed" in result.markdown
    assert "## Metric ranges" not in result.markdown


def test_metrics_jsonl_wins_over_learning_log_and_a_log_path_reads_the_log(tmp_path: Path) -> None:
    folder = healthy(tmp_path)
    (folder / "learning.log").write_text(SEED_LOG, encoding="utf-8")
    assert report(folder).status == "green"
    assert report(folder / "learning.log", SEED).decision == "adjust"


def test_advice_steps_from_the_runs_own_settings(tmp_path: Path) -> None:
    (tmp_path / "learning.log").write_text(HEADER.format(t=1.1) + SEED_LOG, encoding="utf-8")
    markdown = report(tmp_path, SEED).markdown
    assert "export GRPO_TEMPERATURE=1.3" in markdown and "GRPO_TEMPERATURE=1.1" not in markdown


@pytest.mark.parametrize(
    ("rate", "exports", "left_out"),
    [
        ("0.0002", ["export GRPO_LEARNING_RATE=1e-4  # gradient spikes: smaller steps"], "3.2e-4"),
        (
            "5e-05",
            ["export GRPO_LEARNING_RATE=8e-5  # low absolute reward: rewards should climb faster"],
            None,
        ),
    ],
)
def test_two_issues_that_pull_the_learning_rate_both_ways_get_the_smaller_step_never_below_5e_5(
    tmp_path: Path, rate: str, exports: list[str], left_out: str | None
) -> None:
    # A real run's shape (the real 0.5B on the learning bench): a low reward asks the seed's bands for a
    # higher rate while the gradient spikes ask for a lower one; one export of each setting, the stable one,
    # and never a LoRA rate under 5e-5 (the only one that moved the real 0.5B's held-out problems).
    rows = metrics_rows(12, 0.48, reward=lambda e: 0.08, frac=lambda e: 0.0)
    for row in rows:
        row["grad_norm"] = 1.5
    header = HEADER.replace("temperature = {t}", f"learning_rate = {rate}")
    folder = write_run(tmp_path, rows, metrics=False, header=header)
    markdown = report(folder, SEED).markdown
    assert [
        line for line in markdown.splitlines() if line.startswith("export GRPO_LEARNING_RATE=")
    ] == exports
    if left_out:
        assert (
            f"# not GRPO_LEARNING_RATE={left_out} (low absolute reward): GRPO_LEARNING_RATE=1e-4 first"
            in markdown
        )
    relative = report(folder)  # the same levels on every step: nothing changed, nothing to advise
    assert (relative.status, relative.decision) == (
        "green",
        "continue",
    ) and "export " not in relative.markdown


def test_reward_logs_give_stages_errors_examples_and_the_gate_advice(tmp_path: Path) -> None:
    folder = healthy(tmp_path)
    short = "let is_even n =\n  n mod 2 = 0\n(* END *)"
    unbound = ["line 3: Unbound value foo Hint: Did you mean fo?", "line 9: Unbound value foo"]
    rows = (
        [breakdown("gated", i, short) for i in range(40)]
        + [breakdown("type_error", i, "let f x = x +. 1", unbound[i % 2]) for i in range(30)]
        + [breakdown("syntax_error", i, "let f x = (", f"line {i}: Syntax error") for i in range(10)]
        + [breakdown("tests_failed", i, "let f x = x", passed=1) for i in range(10)]
        + [breakdown("passed", i, "let f x = x + 1", passed=3) for i in range(10)]
    )
    write_reward_logs(folder, rows)
    result = report(folder)
    markdown = result.markdown
    assert "## Where completions fail (100 scored completions)" in markdown
    assert "| gated | 40 | 40.0% |" in markdown and "| type_error | 30 | 30.0% |" in markdown
    assert "Compiled: 20.0%. Passed some tests: 10.0%. Passed all tests: 10.0%." in markdown
    assert "| 30 | `Unbound value foo` |" in markdown and "| 10 | `Syntax error` |" in markdown
    assert "look like OCaml but were gated" in markdown and "export MIN_NON_EMPTY_LINES=4" in markdown
    assert "**type_error** (p29)" in markdown
    assert (result.status, result.decision) == ("yellow", "adjust")


def test_a_completions_own_fence_stays_inside_the_reports_example(tmp_path: Path) -> None:
    folder = healthy(tmp_path)
    real = "Here is the function:\n\n```ocaml\nlet rec rec f x =\n  x + 1\n(* END *)\n```"
    write_reward_logs(folder, [breakdown("syntax_error", i, real, "line 1: Syntax error") for i in range(3)])
    blocks = code_blocks(report(folder).markdown)
    assert real in blocks  # whole, its own fence included, not cut at it
    assert "line 1: Syntax error" in blocks


def test_gated_gibberish_is_not_blamed_on_the_gate(tmp_path: Path) -> None:
    folder = healthy(tmp_path)
    write_reward_logs(folder, [breakdown("gated", i, "\x1f\ufffd raises <> Coin nc") for i in range(50)])
    result = report(folder, SEED)
    assert "MIN_NON_EMPTY_LINES" not in result.markdown
    criteria = {c.name: c.holds for c in result.criteria}
    assert criteria["completions are gibberish"] and criteria["no test passes"]
    relative = report(folder)  # random tokens stop a run at any epoch: no model writes OCaml like that
    assert (relative.status, relative.decision) == ("red", "stop")


def test_cli_writes_analysis_md_and_valid_pngs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = with_evals(tmp_path, pass1=lambda e: 0.05 + 0.3 * e, eval_reward=lambda e: 0.2)
    write_reward_logs(folder, [breakdown("passed", i, "let f x = x") for i in range(20)])
    assert analyze.main([str(folder)]) == 0
    printed = capsys.readouterr().out
    written = (folder / "analysis.md").read_text(encoding="utf-8")
    assert printed.strip() == written.strip() and written.startswith("Status: green\nDecision: continue\n")
    for name in ("reward", "eval", "frac_zero_std", "entropy", "stages"):
        png = folder / f"analysis_{name}.png"
        assert png.read_bytes().startswith(PNG_MAGIC), name
        assert matplotlib.image.imread(png).shape[0] > 100
        assert f"![analysis_{name}](analysis_{name}.png)" in written


def test_cli_judges_by_the_bands_of_its_flag_or_env(tmp_path: Path, monkeypatch, capsys) -> None:
    (tmp_path / "learning.log").write_text(SEED_LOG, encoding="utf-8")
    monkeypatch.delenv("GRPO_MONITOR_BANDS", raising=False)
    assert analyze.main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("Status: green\nDecision: continue\n")  # relative: no change
    monkeypatch.setenv("GRPO_MONITOR_BANDS", "seed")
    assert analyze.main([str(tmp_path)]) == 0
    assert "Judged by the seed bands (GRPO_MONITOR_BANDS=seed)" in capsys.readouterr().out
    assert analyze.main([str(tmp_path), "--monitor-bands", "relative"]) == 0  # the flag wins
    assert capsys.readouterr().out.startswith("Status: green\n")
    monkeypatch.setenv("GRPO_MONITOR_BANDS", "absolute")
    with pytest.raises(SystemExit):
        analyze.main([str(tmp_path)])
    assert "GRPO_MONITOR_BANDS='absolute': expected one of relative, seed" in capsys.readouterr().err


def test_cli_refuses_a_folder_without_logs(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"no metrics\.jsonl or learning\.log"):
        analyze.main([str(tmp_path)])


def steps_of(rows: list[dict]) -> list[tuple[int, float]]:
    return [(int(r["step"]), round(r.get("reward", r.get("eval/pass@1", -1.0)), 3)) for r in rows]


def test_a_resumed_run_counts_each_step_once_the_later_one_wins_and_the_report_says_so(
    tmp_path: Path,
) -> None:
    """issue 9: killed at step 13, resumed from checkpoint-10; evaluations every 4 steps."""
    rng = random.Random(0)
    before = [metrics_row(s, s / 40, 0.10, 0.0, 0.15, rng) for s in range(1, 14)]
    after = [metrics_row(s, s / 40, 0.30, 0.0, 0.15, rng) for s in range(11, 31)]
    append_process(tmp_path, before, [eval_row(s, s / 40, 0.05, 0.1) for s in (4, 8, 12)])
    append_process(tmp_path, after, [eval_row(s, s / 40, 0.15, 0.3) for s in (12, 16, 20)], "checkpoint-10")
    expected = [(s, 0.1 if s <= 10 else 0.3) for s in range(1, 31)]
    expected_evals = [(4, 0.05), (8, 0.05), (12, 0.15), (16, 0.15), (20, 0.15)]
    sentence = re.compile(
        r"^- Resumed from checkpoint-10 at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d; steps 11-13 were logged twice, "
        r"the later ones count\.$",
        re.M,
    )
    for source in (tmp_path, tmp_path / "learning.log"):  # metrics.jsonl, then learning.log alone
        run = analyze.load_run(source)
        assert steps_of(run.history) == expected, source
        assert steps_of(run.evals) == expected_evals, source
        markdown = analyze.analyze(run).markdown
        assert len(sentence.findall(markdown)) == 1, markdown
        assert "30 logged steps with rewards" in markdown
    assert analyze.load_run(tmp_path).source == "metrics.jsonl"


def test_steps_follow_logging_steps_across_two_resumes(tmp_path: Path) -> None:
    """Logging every 2nd step: killed at 13 (checkpoint-8), the resumed run killed again after logging
    step 10, then resumed from checkpoint-8 once more."""
    rng = random.Random(1)

    def rows(steps: range, reward: float) -> list[dict]:
        return [metrics_row(s, s / 40, reward, 0.0, 0.15, rng) for s in steps]

    append_process(tmp_path, rows(range(2, 13, 2), 0.1), every=2)
    append_process(tmp_path, rows(range(10, 11, 2), 0.2), resume_from="checkpoint-8", every=2)
    append_process(tmp_path, rows(range(10, 21, 2), 0.3), resume_from="checkpoint-8", every=2)
    expected = [(s, 0.1 if s <= 8 else 0.3) for s in range(2, 21, 2)]
    assert steps_of(analyze.load_run(tmp_path).history) == expected
    run = analyze.load_run(tmp_path / "learning.log")
    assert steps_of(run.history) == expected
    first, second = (resume.sentence() for resume in run.resumes)
    assert first.endswith(
        "; step 10 was logged twice, the later ones count; step 12 was not reached again, so what the "
        "earlier run logged there is left out."
    )
    assert second.endswith("; step 10 was logged twice, the later ones count.")


def test_eval_lines_read_as_the_metrics_rows_and_bad_ones_are_skipped() -> None:
    row = eval_row(20, 0.5, 0.25, 0.231)
    assert analyze.parse_eval_line(format_eval_line(row)) == pytest.approx(row)
    assert analyze.parse_eval_line(format_eval_line(row).replace("±", "Â±")) == pytest.approx(row)
    for other in (
        "[Eval Epoch 0.50]  step=20  pass@1=x",
        "[Eval Epoch 0.50]  problems=40  pass@1=0.1",  # no step: cannot be placed
        "[Epoch 0.50]  step=20  pass@1=0.1",
        "# [Eval Epoch 0.50]  step=20  pass@1=0.1",
    ):
        assert analyze.parse_eval_line(other) is None
        assert analyze.parse_log_line(other) is None


def with_evals(folder: Path, pass1, eval_reward) -> Path:
    """The healthy run (reward 0.05 -> 0.55 over one epoch) with an evaluation every 0.2 epochs."""
    healthy(folder)
    rows = [eval_row(12 * i, 0.2 * i, pass1(0.2 * i), eval_reward(0.2 * i)) for i in range(1, 6)]
    with open(folder / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write("\n" + "".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_training_reward_rising_while_eval_pass_at_1_stays_flat_is_memorising(tmp_path: Path) -> None:
    result = report(with_evals(tmp_path, pass1=lambda e: 0.10, eval_reward=lambda e: 0.2))
    markdown = result.markdown
    assert (result.status, result.decision) == ("yellow", "adjust"), markdown
    assert "Memorising the training problems" in markdown and "**Struggling.** Memorising" in markdown
    assert "export GRPO_LEARNING_RATE" not in markdown  # 5e-6 is under 5e-5 already: no lower rate
    assert "## Held-out evaluation" in markdown and "40 problems, 1 sample(s) each" in markdown
    assert "| Step | Epoch | pass@1 | Reward | Passed |" in markdown
    assert "| 36 | 0.60 | 10.0% | 0.200 | 10.0% |" in markdown
    assert (
        "- **Memorising the training problems.** `eval pass@1 gain` = 0 over 5 evaluations at epoch 0.20-1.00"
        in markdown
    )


@pytest.mark.parametrize(
    ("pass1", "eval_reward"),
    [(lambda e: 0.05 + 0.3 * e, lambda e: 0.2), (lambda e: 0.10, lambda e: 0.05 + 0.4 * e)],
    ids=["pass@1 rises", "eval reward keeps pace"],
)
def test_eval_progress_is_not_memorising(tmp_path: Path, pass1, eval_reward) -> None:
    result = report(with_evals(tmp_path, pass1, eval_reward))
    assert (result.status, result.decision) == ("green", "continue"), result.markdown
    assert "- Not memorising the training problems: `eval pass@1 gain`" in result.markdown
