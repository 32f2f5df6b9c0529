"""bench/train_step.py --tiny: train.py's real GRPO runs on the tiny model, plain and compiled sampling in one
invocation, timed and tabulated, with the compiled sampler's checks. `--tiny` is the CPU's smoke run, so the
bench is given no GPU even on a box that has one: the device column, the float32 agreement and its
tolerance are the CPU's."""

import os
import re

COLUMNS = [
    "device",
    "sampling",
    "checkpointing",
    "step s",
    "generation s",
    "reward s",
    "update s",
    "tokens/s",
    "completions/s",
    "completion tokens",
    "peak memory GiB",
    "first-step compile s",
]


def test_tiny_runs_print_one_row_per_sampling_path_and_the_checks(run_python) -> None:
    result = run_python(
        *("bench/train_step.py", "--tiny", "--steps", "2", "--gradient-checkpointing", "off"),
        timeout=600,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},  # torch (and libcuda) see no GPU
    )
    assert result.returncode == 0, result.stderr[-3000:]
    table = [line for line in result.stdout.splitlines() if line.startswith("|")]
    assert len(table) == 4, result.stdout[-2000:]
    header, rule, *rows = ([cell.strip() for cell in line.strip("|").split("|")] for line in table)
    assert header == COLUMNS
    assert set(rule) == {"---"}
    assert [row[1:3] for row in rows] == [["plain", "off"], ["compiled", "off"]]
    assert all(row[0].startswith("CPU") for row in rows)
    assert rows[0][-1] == "-"  # plain sampling compiles nothing
    for row in rows:
        figures = dict(zip(header[3:-1], map(float, row[3:-1]), strict=True))
        if row[1] == "compiled":
            assert abs(float(row[-1])) < 60  # a difference of two timings: either sign on the CPU
        assert all(value > 0 for value in figures.values()), figures
        # The split adds up: generation + reward + update is the step (each rounded to 3 significant digits).
        parts = figures["generation s"] + figures["reward s"] + figures["update s"]
        assert abs(parts - figures["step s"]) <= 0.02 * figures["step s"]
        assert 0 < figures["completion tokens"] <= 512
    assert "worst case for generation" in result.stdout
    assert "compiled, checkpointing off: base weights bit-identical after 2 steps: yes" in result.stdout
    agreement = re.search(
        r"\(float32, (\d+) completion tokens\): max \|log-prob difference\| (\S+);", result.stdout
    )
    assert agreement and int(agreement[1]) > 1000 and float(agreement[2]) < 1e-4, result.stdout[-1000:]
