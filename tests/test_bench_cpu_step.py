"""bench/cpu_step.py --tiny: train.py's real GRPO runs of the tiny model in bf16 on the CPU, before and after
cpu_training.py's changes, with each change left out alone (the update's shared prompts, its passes of a
group, the dropout masks, the LM head's folds, the LoRA's forward) and without LoRA dropout, in one
process: a line per optimizer step with sampling, reward and update seconds, tokens/s and the limits, then
the table of means and the ratios."""

import os
import re

from bench.cpu_step import ARMS


def test_tiny_runs_print_each_step_against_its_limits_and_the_table(run_python) -> None:
    result = run_python(
        *("bench/cpu_step.py", "--tiny", "--steps", "2", "--arms", ",".join(ARMS)),
        timeout=900,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},  # the CPU's bench, on any box
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    rates = re.findall(r"bf16 matmul (\d+) GFLOP/s; weights streamed at (\S+) GB/s", out)
    assert len(rates) == len(ARMS), out[-2000:]
    assert all(float(gflops) > 0 and float(gbs) > 0 for gflops, gbs in rates)
    step = re.compile(
        rf"^({'|'.join(ARMS)}) step (\d): (\S+) s a completion; "
        r"sampling (\S+) s \((\d+) tokens/s; limit (\S+) s, (\S+)x\); reward (\S+) s \((\d+) tokens/s\); "
        r"update (\S+) s \((\d+) tokens/s; limit (\S+) s, (\S+)x\)",
        re.MULTILINE,
    )
    lines = step.findall(out)
    assert [(arm, n) for arm, n, *_ in lines] == [(arm, n) for arm in ARMS for n in ("1", "2")]
    for _, _, per_completion, sampling, _, _, sampling_x, reward, _, update, _, _, update_x in lines:
        # The tiny model's limits round to 0.0 s.
        assert all(float(v) > 0 for v in (per_completion, sampling, update))
        # Each part's time over its limit; the limit comes from a rate measured in the same run, and a load
        # that changes between the two moves the ratio either way, so only that it was computed is asserted.
        assert float(sampling_x) > 0 and float(update_x) > 0
        assert float(reward) >= 0
        # The parts are parts of the step (16 completions): the update is what the step's time leaves after
        # sampling and reward, so the printed figures agree within their rounding (three parts to 0.1 s, the
        # step's 16 completions to 0.01 s each).
        step = 16 * float(per_completion)
        assert abs(float(sampling) + float(reward) + float(update) - step) <= 3 * 0.05 + 16 * 0.005 + 1e-9
    table = [line for line in out.splitlines() if line.startswith("|")]
    assert [cell.strip() for cell in table[0].strip("|").split("|")] == [
        "arm",
        "s a completion",
        "sampling s",
        "reward s",
        "update s",
        "load",
    ]
    assert [row.split("|")[1].strip() for row in table[2:]] == list(ARMS)
    assert re.search(r"before / after: per completion \S+x, sampling \S+x, update \S+x", out)
    assert re.search(r"unshared / after: per completion \S+x, sampling \S+x, update \S+x", out)
    assert re.search(r"split-groups / after: per completion \S+x, sampling \S+x, update \S+x", out)
    assert re.search(r"torch-dropout / after: per completion \S+x, sampling \S+x, update \S+x", out)
    assert re.search(r"trl-head / after: per completion \S+x, sampling \S+x, update \S+x", out)
    assert re.search(r"peft-lora / after: per completion \S+x, sampling \S+x, update \S+x", out)
    assert re.search(r"after / no-dropout: per completion \S+x, sampling \S+x, update \S+x", out)
    assert re.search(r"^no-dropout: load average .*; train\.py --lora-dropout 0$", out, re.MULTILINE)


def test_a_tiny_sft_run_prints_each_step_the_table_and_the_ratio(run_python) -> None:
    result = run_python(
        *("bench/cpu_step.py", "--tiny", "--sft", "--steps", "2", "--arms", "torch-dropout,after"),
        timeout=900,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    steps = re.findall(
        r"^(\S+) SFT step (\d): \S+ s \(\d+ tokens/s; limit \S+ s, \S+x\); (\d+) tokens, (\d+) of them "
        "answer",
        out,
        re.MULTILINE,
    )
    assert [(arm, n) for arm, n, *_ in steps] == [(a, n) for a in ("torch-dropout", "after") for n in "12"]
    assert all(0 < int(answer) < int(tokens) for *_, tokens, answer in steps)
    table = [line for line in out.splitlines() if line.startswith("| ") and "SFT s" not in line]
    assert [row.split("|")[1].strip() for row in table] == ["torch-dropout", "after"]
    assert re.search(r"^after / torch-dropout tokens/s: \d+\.\d\dx$", out, re.MULTILINE)
