"""Dynamic sampling on TRL's GRPOTrainer, trained for real on the tiny model.

The trainer tests use a reward that ties by design (one per problem: the same score for every completion of
a "tied" problem, the completion's place in its group for the others), so that which groups tie does not
depend on what the model samples: the filter's bookkeeping is then checked exactly. The OCaml reward's
path (reward_logs marked kept/dropped, learning.log, metrics.jsonl) is checked through train.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench.dynamic_sampling import filling_trainer
from dynamic_sampling import (
    POSITION_FILE,
    DynamicSamplingTrainer,
    concat_rounds,
    micro_batch_sizes,
    tied_groups,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NAMES = [f"fn{i:02d}" for i in range(12)]


def test_tied_groups_counts_solved_and_failed_groups_alike_within_the_tolerance() -> None:
    rewards = torch.tensor(
        [
            *(1.0, 1.0, 1.0),  # solved
            *(0.0, 0.0, 0.0),  # failed
            *(0.3, 0.3 + 5e-7, 0.3),  # within 1e-6
            *(0.3, 0.3 + 5e-6, 0.3),  # apart
            *(0.2, float("nan"), 0.9),  # one unscorable, the others differ
            *(0.2, float("nan"), float("nan")),  # one scored completion: nothing to compare
        ]
    )
    assert tied_groups(rewards, 3).tolist() == [True, True, True, False, False, True]


@pytest.mark.parametrize("rows,chunks", [(24, 6), (18, 6), (4, 6), (0, 6), (7, 3)])
def test_micro_batches_hold_every_row_and_the_last_one_is_never_empty_when_any_is_not(rows, chunks) -> None:
    sizes = micro_batch_sizes(rows, chunks)
    assert len(sizes) == chunks and sum(sizes) == rows
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes)
    assert rows == 0 or sizes[-1] > 0


def test_rounds_of_different_widths_are_padded_on_the_side_tril_pads() -> None:
    one = {"prompt_ids": torch.tensor([[5, 6]]), "prompt_mask": torch.tensor([[1, 1]]),
           "completion_ids": torch.tensor([[7]]), "completion_mask": torch.tensor([[1]]),
           "advantages": torch.tensor([0.5])}  # fmt: skip
    two = {"prompt_ids": torch.tensor([[8]]), "prompt_mask": torch.tensor([[1]]),
           "completion_ids": torch.tensor([[9, 10]]), "completion_mask": torch.tensor([[1, 1]]),
           "advantages": torch.tensor([-0.5])}  # fmt: skip
    batch = concat_rounds([one, two], pad_token_id=0)
    assert batch["prompt_ids"].tolist() == [[5, 6], [0, 8]]  # prompts left-padded
    assert batch["prompt_mask"].tolist() == [[1, 1], [0, 1]]
    assert batch["completion_ids"].tolist() == [[7, 0], [9, 10]]  # completions right-padded
    assert batch["completion_mask"].tolist() == [[1, 0], [1, 1]]
    assert batch["advantages"].tolist() == [0.5, -0.5]
    with pytest.raises(ValueError, match="pixel_values"):
        concat_rounds([{**one, "pixel_values": torch.zeros(1, 3)}], pad_token_id=0)


# --- the trainer, on the tiny model ------------------------------------------------------------------------


class DesignedReward:
    """Ties every group of a problem in `tied` (all 1.0: "solved"); any other group scores its completions
    0, 1, 2, ... by place. Records the problems of every call, in order."""

    __name__ = "designed_reward"

    def __init__(self, tied: set[str], group: int) -> None:
        self.tied, self.group, self.calls = tied, group, []

    def __call__(self, prompts, completions, problem_id, **kwargs) -> list[float]:
        self.calls.append(list(problem_id[:: self.group]))
        return [1.0 if p in self.tied else float(i % self.group) for i, p in enumerate(problem_id)]


class LossSpy(DynamicSamplingTrainer):
    """Records the problem of every row that reaches the loss (decoded from its prompt tokens)."""

    seen: list[str]

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        for row in inputs["prompt_ids"]:
            text = self.processing_class.decode(row, skip_special_tokens=True)
            self.seen.append(next(n for n in NAMES if n in text))
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


def dataset(names: list[str]):
    from datasets import Dataset

    return Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": f"let {n} (x : int) : int ="}], "problem_id": n}
            for n in names
        ]
    )


def trainer(tiny_model: Path, out: Path, reward, *, cls=LossSpy, names=NAMES, **settings):
    """Two prompts x two completions a step, as train.py sets TRL up (a round per optimizer step)."""
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    mode = settings.pop("dynamic_sampling", "filter")
    max_rounds = settings.pop("max_rounds", 3)
    args = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,  # GRPO_GRAD_ACCUM_STEPS (1) x GRPO_NUM_GENERATIONS
        num_generations=2,
        max_completion_length=6,
        learning_rate=1e-2,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="steps",
        report_to="none",
        seed=7,
        bf16=False,
        dataloader_pin_memory=False,
        **{"max_steps": 4, "save_steps": 100, **settings},
    )
    from trl import GRPOTrainer

    notes: list[str] = []
    kwargs = {"dynamic_sampling": mode, "max_rounds": max_rounds, "note": notes.append} if cls else {}
    made = (cls or GRPOTrainer)(
        model=str(tiny_model),
        reward_funcs=[reward],
        args=args,
        train_dataset=dataset(names),
        processing_class=AutoTokenizer.from_pretrained(tiny_model),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
        **kwargs,
    )
    made.seen, made.notes = [], notes
    return made


def logged(t) -> list[dict]:
    return [row for row in t.state.log_history if "loss" in row]


def lora_weights(t) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in t.model.named_parameters() if "lora_" in n}


def test_off_is_exactly_trls_grpo_trainer(tiny_model: Path, tmp_path: Path) -> None:
    runs = []
    for cls in (None, DynamicSamplingTrainer):  # eight steps: past the first epoch's end (six steps)
        torch.manual_seed(0)
        t = trainer(tiny_model, tmp_path / str(cls), DesignedReward(set(NAMES[:4]), 2), cls=cls,
                    dynamic_sampling="off", max_steps=8)  # fmt: skip
        t.train()
        runs.append((logged(t), lora_weights(t), t.reward_funcs[0].calls))
    (rows_trl, weights_trl, calls_trl), (rows_off, weights_off, calls_off) = runs
    drop = ("train_runtime", "step_time")
    assert [{k: v for k, v in r.items() if not k.endswith(drop)} for r in rows_trl] == [
        {k: v for k, v in r.items() if not k.endswith(drop)} for r in rows_off
    ]
    assert calls_trl == calls_off and len(calls_off) == 8
    assert all(torch.equal(weights_trl[n], weights_off[n]) for n in weights_trl)
    assert not any(k.startswith("dynamic/") for r in rows_off for k in r)


def test_filter_keeps_tied_groups_out_of_the_loss_and_the_counts_add_up(
    tiny_model: Path, tmp_path: Path
) -> None:
    tied = set(NAMES[::2])  # half the problems
    t = trainer(tiny_model, tmp_path, DesignedReward(tied, 2), max_steps=3, max_rounds=1)
    t.train()
    assert t.seen and not tied & set(t.seen)  # rows did train, none of a tied problem
    rows = logged(t)
    assert len(rows) == 3
    sampled_problems = [p for call in t.reward_funcs[0].calls for p in call]
    for row in rows:
        assert row["dynamic/groups_sampled"] == row["dynamic/groups_dropped"] + row["dynamic/groups_trained"]
        assert row["dynamic/extra_rounds"] <= 1  # the round cap
        assert row["frac_reward_zero_std"] == 0.0  # the trained batch
    assert sum(r["dynamic/groups_sampled"] for r in rows) == len(sampled_problems)
    assert sum(r["dynamic/groups_trained"] for r in rows) * 2 == len(t.seen)  # 2 completions a group
    sampled_tied = sum(p in tied for p in sampled_problems) / len(sampled_problems)
    assert sum(
        r["dynamic/frac_zero_std_sampled"] * r["dynamic/groups_sampled"] for r in rows
    ) == pytest.approx(sampled_tied * len(sampled_problems))
    # Each problem sampled once an epoch, in the data's order: no problem twice before all were seen.
    assert len(set(sampled_problems[:12])) == min(12, len(sampled_problems))


def test_a_step_with_only_tied_groups_spends_the_round_cap_and_changes_no_weight(
    tiny_model: Path, tmp_path: Path
) -> None:
    t = trainer(tiny_model, tmp_path, DesignedReward(set(NAMES), 2), max_steps=2, max_rounds=2)
    before = lora_weights(t)
    t.train()
    rows = logged(t)
    assert [r["dynamic/extra_rounds"] for r in rows] == [2, 2]  # 3 rounds a step, the cap
    assert [r["dynamic/groups_trained"] for r in rows] == [0, 0]
    assert [r["dynamic/frac_zero_std_sampled"] for r in rows] == [1.0, 1.0]
    assert len(t.reward_funcs[0].calls) == 6 and t.seen == []
    after = lora_weights(t)
    assert all(torch.equal(before[n], after[n]) for n in before)  # no update, not even Adam's momentum
    assert any("tied, so the step changes no weight" in n for n in t.notes)


def test_a_step_that_trained_no_group_prints_entropy_n_a_which_the_readers_take_as_no_value(
    tiny_model: Path, tmp_path: Path
) -> None:
    """TRL logs no entropy for a step in which every sampled group tied, or NaN (its mean over no tokens: the
    H100 box's learning.log said entropy=nan). learning.log prints n/a, analyze.py reads the line without an
    entropy, and the monitor's row has none either."""
    import math

    import analyze
    import monitor
    from run_records import format_log_line

    t = trainer(tiny_model, tmp_path, DesignedReward(set(NAMES), 2), max_steps=1, max_rounds=1)
    t.train()
    [step] = logged(t)
    assert step["dynamic/groups_trained"] == 0 and math.isnan(step.get("entropy", math.nan))
    for logs in (step, step | {"entropy": math.nan}):
        line = format_log_line(logs, DesignedReward.__name__)
        assert "  entropy=n/a  " in line and line.endswith("kept=0/4"), line
        parsed = analyze.parse_log_line(line)
        assert parsed is not None and parsed["reward"] == 1.0 and "entropy" not in parsed
        assert "entropy" not in monitor.numeric(logs)


def test_the_benchs_fill_arm_tops_a_short_step_up_with_the_best_dropped_groups(
    tiny_model: Path, tmp_path: Path
):
    filling = filling_trainer(LossSpy)
    t = trainer(
        tiny_model, tmp_path, DesignedReward(set(NAMES[1:]), 2), cls=filling, max_steps=2, max_rounds=1
    )
    t.train()
    rows = logged(t)
    assert [r["dynamic/groups_trained"] for r in rows] == [2, 2]  # a round's worth, whatever tied
    assert all(r["frac_reward_zero_std"] >= 0.5 for r in rows)  # at most one informative group a step
    assert len(t.seen) == 2 * 2 * 2


def test_a_dataset_too_small_to_fill_a_step_ends_cleanly_and_says_so(tiny_model: Path, tmp_path: Path):
    # Six problems, three rounds an epoch, one informative problem: the first step reads the whole epoch.
    names = NAMES[:6]
    t = trainer(tiny_model, tmp_path, DesignedReward(set(names[:5]), 2), names=names, max_steps=-1,
                num_train_epochs=1)  # fmt: skip
    t.train()
    rows = logged(t)
    assert len(rows) == 1 and rows[0]["dynamic/groups_sampled"] == 6  # every problem once, none twice
    assert t.seen == [names[5]] * 2  # the informative problem's two completions
    notes = "\n".join(t.notes)
    assert "ran out while step 1 was being filled; it trains 1 of 2 groups" in notes
    assert "the data ended the run at step 1; without filtering it would have run 3 steps" in notes


def test_resume_after_filtering_continues_the_data_where_it_stopped(tiny_model: Path, tmp_path: Path) -> None:
    """Eight steps read the twelve problems over three epochs; a run stopped at step 3 and resumed samples
    the same problems in the same order as the one that was never stopped (the designed reward makes the
    filtering independent of the weights, so the order is the data's alone)."""
    tied = set(NAMES[::3])
    whole = trainer(tiny_model, tmp_path / "whole", DesignedReward(tied, 2), max_steps=8, max_rounds=1)
    whole.train()
    expected = [p for call in whole.reward_funcs[0].calls for p in call]
    assert len(expected) > 24  # past two epochs' boundaries

    reward = DesignedReward(tied, 2)
    first = trainer(tiny_model, tmp_path / "parts", reward, max_steps=3, save_steps=3, max_rounds=1)
    first.train()
    checkpoint = tmp_path / "parts" / "checkpoint-3"
    position = json.loads((checkpoint / POSITION_FILE).read_text())
    assert position["batches"] > 3 * 2  # more than TRL's count of one round a step: extra rounds were read
    second = trainer(tiny_model, tmp_path / "parts", reward, max_steps=8, max_rounds=1)
    second.train(resume_from_checkpoint=str(checkpoint))
    assert [p for call in reward.calls for p in call] == expected
    assert [r["epoch"] for r in logged(second)] == [r["epoch"] for r in logged(whole)]  # history included


def test_resume_without_filtering_reads_the_epoch_it_resumes_in(tiny_model: Path, tmp_path: Path) -> None:
    """With filtering off, a run stopped in its second epoch and resumed samples what the uninterrupted run
    samples there (TRL's own sampler would replay the first epoch's shuffle and repeat some problems)."""
    whole = trainer(
        tiny_model, tmp_path / "whole", DesignedReward(set(), 2), dynamic_sampling="off", max_steps=10
    )
    whole.train()
    expected = [p for call in whole.reward_funcs[0].calls for p in call]

    reward = DesignedReward(set(), 2)
    first = trainer(tiny_model, tmp_path / "parts", reward, dynamic_sampling="off", max_steps=7, save_steps=7)
    first.train()
    second = trainer(tiny_model, tmp_path / "parts", reward, dynamic_sampling="off", max_steps=10)
    second.train(resume_from_checkpoint=str(tmp_path / "parts" / "checkpoint-7"))
    assert [p for call in reward.calls for p in call] == expected
    assert expected[12:20] != expected[:8]  # the second epoch has its own shuffle, which a resume must keep


# --- the OCaml reward's logs, and train.py end to end -------------------------------------------------------


def test_held_reward_logs_are_written_in_order_with_each_completions_mark(tmp_path: Path) -> None:
    import asyncio

    from problems import DEMO_PROBLEMS, load_rows
    from rewards import END_MARKER, RewardConfig, SyntaxAwareReward

    p = next(iter(load_rows(DEMO_PROBLEMS)))
    good = f"```ocaml\n{p['prompt'].splitlines()[-1]}{p['solution']}\n{END_MARKER}\n```"
    reward = SyntaxAwareReward(RewardConfig(min_non_empty_lines=1), tmp_path, max_completion_length=64)
    log = tmp_path / "completions.jsonl"

    def score(completions: list[str]) -> list[float]:
        n = len(completions)
        kwargs = {"problem": [p["prompt"]] * n, "tests": [p["tests"]] * n, "problem_id": [p["id"]] * n}
        return asyncio.run(reward(prompts=["..."] * n, completions=completions, **kwargs))

    try:
        reward.hold_logs()
        first = score(["garbage", good])  # a round
        assert first[0] < first[1] == 1.0
        assert score([good, good]) == [1.0, 1.0]  # an extra round: it tied
        assert not log.exists() or log.read_text() == ""  # held until the step's groups are chosen
        reward.write_held([{"sampling": "kept", "sampling_round": 0}] * 2 + [{"sampling": "dropped"}] * 2)
        score(["garbage"])  # no longer held: written at once, unmarked
    finally:
        reward.close()
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["reward"], r.get("sampling")) for r in rows] == [
        (first[0], "kept"),
        (1.0, "kept"),
        (1.0, "dropped"),
        (1.0, "dropped"),
        (first[0], None),
    ]
    breakdowns = (tmp_path / "syntax_aware_breakdown.jsonl").read_text().splitlines()
    assert [json.loads(line).get("sampling") for line in breakdowns] == [
        "kept",
        "kept",
        "dropped",
        "dropped",
        None,
    ]


def test_train_py_filters_with_the_ocaml_reward_and_logs_every_completion_marked(
    tiny_model: Path, tmp_path: Path
) -> None:
    """The random tiny model's answers all fail alike, so every group ties: each step spends the round cap,
    trains nothing, and says so; every sampled completion is in reward_logs, marked dropped."""
    import analyze
    from problems import BUNDLED_PROBLEMS
    from train import main

    out = tmp_path / "run"
    argv = [
        *(
            "--model-id",
            str(tiny_model),
            "--training-dataset",
            str(BUNDLED_PROBLEMS),
            "--output-dir",
            str(out),
        )
    ]
    argv += [*("--batch-size", "2", "--num-generations", "2", "--max-completion", "12", "--max-steps", "2")]
    argv += [*("--lora-r", "4", "--lora-alpha", "8", "--eval-steps", "none", "--save-steps", "2")]
    argv += ["--dynamic-sampling", "filter", "--dynamic-max-rounds", "1", "--report-to", "none"]
    assert main(argv, environ={}) == 0
    log = (out / "learning.log").read_text(encoding="utf-8")
    assert "# dynamic sampling: filter; groups whose rewards all tie (within 1e-06) are dropped" in log
    lines = [line for line in log.splitlines() if line.startswith("[Epoch")]
    assert len(lines) == 2 and all(line.endswith("frac_zero_std=1.00  kept=0/4") for line in lines), lines
    assert "tied, so the step changes no weight" in log
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "loss" in m]
    assert [m["dynamic/groups_sampled"] for m in steps] == [4, 4] and all(
        m["dynamic/extra_rounds"] == 1 and m["dynamic/groups_dropped"] == 4 for m in steps
    )
    completions = [
        json.loads(line) for line in (out / "reward_logs" / "completions.jsonl").read_text().splitlines()
    ]
    assert len(completions) == 2 * 2 * 2 * 2  # steps x rounds x prompts x completions, each scored once
    assert {c["sampling"] for c in completions} == {"dropped"}
    assert [c["sampling_round"] for c in completions] == [0, 0, 0, 0, 1, 1, 1, 1] * 2
    report = analyze.analyze(analyze.load_run(out)).markdown
    assert "## Dynamic sampling" in report and "8 groups sampled, 0 trained (0%)" in report
    # 2 steps x 2 rounds, each read as 2 batches (TRL repeats a round once per micro-batch of the step)
    assert json.loads((out / "checkpoint-2" / "dynamic_sampling.json").read_text()) == {
        "epoch": 0,
        "batches": 8,
    }


def test_the_monitor_and_the_report_read_the_sampled_share_of_tied_groups() -> None:
    import analyze
    import health_bands
    from run_records import format_log_line

    step = {
        "epoch": 0.5,
        "loss": 0.01,
        "grad_norm": 0.1,
        "learning_rate": 1e-5,
        "entropy": 0.15,
        "reward": 0.4,
    }
    step |= {"reward_std": 0.2, "frac_reward_zero_std": 0.0, "groups/solved": 0.125}
    step |= {"dynamic/frac_zero_std_sampled": 0.625, "dynamic/groups_sampled": 8.0}
    step |= {"dynamic/groups_trained": 3.0, "dynamic/groups_dropped": 5.0, "dynamic/extra_rounds": 1.0}
    line = format_log_line(step, "syntax_aware_reward")
    assert line.endswith("frac_zero_std=0.62  kept=3/8")  # the sampled share, as the seed counted it
    parsed = analyze.parse_log_line(line)
    assert parsed["frac_reward_zero_std"] == 0.62 and parsed["dynamic/groups_trained"] == 3.0
    assert parsed["dynamic/groups_sampled"] == 8.0
    assert "kept=" not in format_log_line({k: v for k, v in step.items() if not k.startswith("dynamic/")})

    history = [dict(step, step=i) for i in range(1, 7)]
    assert health_bands.stuck_groups(history) == pytest.approx(0.5)  # sampled 0.625 less the solved 0.125
    assert health_bands.check_frac_zero_std(history, health_bands.Knobs()).ok is False  # not the trained 0.0
    section = "\n".join(analyze.dynamic_sampling_section(history))
    assert "48 groups sampled, 18 trained (38%)" in section
    assert (
        "2.00 rounds a step (`off` samples one), 2.67 groups per group trained; 6 steps trained fewer"
        in section
    )
    assert analyze.dynamic_sampling_section([{k: v for k, v in step.items() if "dynamic" not in k}]) == []


def test_two_processes_train_equal_shapes_under_accelerate_launch(tiny_model: Path, tmp_path: Path) -> None:
    """Each process samples its own prompts, so their informative groups differ in number; every process
    must train as many as the one with the fewest (equal shapes, no hang), and no tied group."""
    import os
    import subprocess
    import sys

    from conftest import ROOT, user_environment  # here: the launched processes run this file as a script

    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    launch += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    # The project's modules for the launched script, and the caller's PYTHONPATH after them: where the
    # packages come from it (pip --target), the processes need it to import trl at all.
    python_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    result = subprocess.run(
        [*launch, __file__, str(tiny_model), str(tmp_path)],
        env=user_environment({"ACCELERATE_USE_CPU": "1", "PYTHONPATH": python_path}),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = [json.loads((tmp_path / f"seen-{rank}.json").read_text()) for rank in (0, 1)]
    tied = set(NAMES[::2])
    assert seen[0] and len(seen[0]) == len(seen[1])  # the same number of rows trained on each process
    assert not tied & (set(seen[0]) | set(seen[1]))
    steps = json.loads((tmp_path / "steps.json").read_text())
    assert all(
        s["dynamic/groups_sampled"] == s["dynamic/groups_dropped"] + s["dynamic/groups_trained"]
        for s in steps
    )
    assert all(s["dynamic/groups_trained"] % 2 == 0 for s in steps)  # equal on both processes


if __name__ == "__main__":  # one process of the test above, under accelerate launch
    import sys

    torch.set_num_threads(1)
    model, out = Path(sys.argv[1]), Path(sys.argv[2])
    t = trainer(model, out, DesignedReward(set(NAMES[::2]), 2), max_steps=3, max_rounds=2)
    t.train()
    rank = t.accelerator.process_index
    (out / f"seen-{rank}.json").write_text(json.dumps(t.seen))
    if rank == 0:
        (out / "steps.json").write_text(json.dumps(logged(t)))
    t.accelerator.end_training()  # gloo's threads left to the interpreter's exit can abort the process
