"""bench/dynamic_sampling.py's reading of a run: what it tabulates for an `off` run and a filtering one."""

import importlib.util
import json
from pathlib import Path

from problems import ROOT

spec = importlib.util.spec_from_file_location(
    "bench_dynamic_sampling", ROOT / "bench" / "dynamic_sampling.py"
)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def write_run(folder: Path, steps: list[dict], completions: int) -> Path:
    (folder / "reward_logs").mkdir(parents=True)
    evals = [{"step": 0, "eval/pass@1": 0.25}, {"step": len(steps), "eval/pass@1": 0.5}]
    rows = [evals[0], *({"step": i + 1, "loss": 0.0, **s} for i, s in enumerate(steps)), evals[1]]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "reward_logs" / "completions.jsonl").write_text('{"reward": 0}\n' * completions)
    return folder


def test_an_off_run_trains_every_sampled_completion_and_a_filtering_one_counts_its_rounds(tmp_path: Path):
    off = [
        {"reward": r, "frac_reward_zero_std": 0.25, "step_time": 2.0} for r in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6)
    ]
    m = bench.summary(write_run(tmp_path / "off", off, completions=6 * 24))
    assert m["sampled"] == m["trained"] == 144 and m["extra_rounds"] == 0
    assert m["first5"] == 0.3 and m["last5"] == 0.4 and m["sampled_tied"] == 0.25
    assert m["seconds"] == [2.0, 4.0, 6.0, 8.0, 10.0, 12.0] and m["pass1"] == [0.25, 0.5]

    filtering = [
        {"reward": 0.5, "frac_reward_zero_std": 0.0, "step_time": 3.0, "dynamic/groups_trained": trained,
         "dynamic/extra_rounds": extra, "dynamic/frac_zero_std_sampled": tied}
        for trained, extra, tied in ((4, 1, 0.5), (2, 3, 0.875), (4, 0, 0.0), (4, 0, 0.0), (4, 0, 0.0))
    ]  # fmt: skip
    m = bench.summary(write_run(tmp_path / "filter", filtering, completions=(2 + 4 + 1 + 1 + 1) * 24))
    assert m["trained"] == 18 * 6 and m["sampled"] == 216  # 6 completions a group
    assert m["extra_rounds"] == 0.8 and m["sampled_tied"] == (0.5 + 0.875) / 5
    # At the budget of 3 off steps (72 completions): the steps that had sampled no more than that.
    assert bench.summary(tmp_path / "filter", budget=72)["at_budget"] == 0.5
    m = bench.summary(tmp_path / "off", budget=3 * 24)
    assert m["at_budget"] == 0.2  # the mean of steps 1-3
