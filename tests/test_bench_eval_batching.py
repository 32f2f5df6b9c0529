"""bench/eval_batching.py runs as BENCHMARKS.md says: one row per batch size, and the target line."""

import re
import subprocess
import sys

from problems import ROOT


def test_one_round_times_every_batch_size() -> None:
    result = subprocess.run(
        [sys.executable, "bench/eval_batching.py", "--rounds", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = re.findall(r"^\| (\d+)[^|]* \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+x \|$", result.stdout, re.M)
    assert rows == ["4", "8", "16", "32", "64"], result.stdout
    assert re.search(r"^Target, 40 x 4 in under a minute: (met|missed) \(", result.stdout, re.M)
