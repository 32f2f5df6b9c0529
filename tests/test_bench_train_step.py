"""bench/train_step.py --tiny: train.py's real GRPO run on the tiny model, timed and tabulated."""

import subprocess
import sys

from train import ROOT

COLUMNS = [
    "device",
    "step s",
    "generation s",
    "reward s",
    "update s",
    "tokens/s",
    "completions/s",
    "completion tokens",
    "peak memory GiB",
]


def test_tiny_run_prints_the_table_with_positive_figures() -> None:
    result = subprocess.run(
        [sys.executable, "bench/train_step.py", "--tiny", "--steps", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    table = [line for line in result.stdout.splitlines() if line.startswith("|")]
    assert len(table) == 3, result.stdout[-2000:]
    header, rule, row = ([cell.strip() for cell in line.strip("|").split("|")] for line in table)
    assert header == COLUMNS
    assert set(rule) == {"---"}
    assert row[0].startswith("CPU")
    figures = dict(zip(header[1:], map(float, row[1:]), strict=True))
    assert all(value > 0 for value in figures.values()), figures
    # The split adds up: generation + reward + update is the step (each rounded to 3 significant digits).
    parts = figures["generation s"] + figures["reward s"] + figures["update s"]
    assert abs(parts - figures["step s"]) <= 0.02 * figures["step s"]
    assert 0 < figures["completion tokens"] <= 512
    assert "worst case for generation" in result.stdout
