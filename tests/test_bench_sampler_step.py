"""bench/sampler_step.py --tiny: each arm compiles once in one process and gets a row of ms per decoding step
and its guard checks, and the shipped sampler's ratio to the first arm is printed."""

import subprocess
import sys

from problems import ROOT


def test_a_tiny_run_prints_one_row_per_arm_and_the_ratio() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "bench/sampler_step.py",
            "--tiny",
            "--arms",
            "before,+end-checks",
            "--new-tokens",
            "4",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    table = [line for line in result.stdout.splitlines() if line.startswith("|")]
    header, rule, *rows = ([cell.strip() for cell in line.strip("|").split("|")] for line in table)
    assert header == [
        "arm",
        "ms per decoding step",
        "round s",
        "compile s",
        "guard checks ms",
        "device reads",
    ]
    assert set(rule) == {"---"}
    assert [row[0] for row in rows] == ["before", "+end-checks"]
    assert all(float(cell) > 0 for row in rows for cell in row[1:])
    # Before, the loop read whether every sequence had ended after each of the 4 steps; now it does not.
    reads = {row[0]: float(row[-1]) for row in rows}
    assert reads["before"] - reads["+end-checks"] >= 0.75
    assert "+end-checks vs before: " in result.stdout
    assert "Traceback" not in result.stderr
