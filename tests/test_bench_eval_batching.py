"""bench/eval_batching.py runs as BENCHMARKS.md says: one row per batch size, and the target line."""

import re


def test_one_round_times_every_batch_size(run_python) -> None:
    result = run_python("bench/eval_batching.py", "--rounds", "1", timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = re.findall(r"^\| (\d+)[^|]* \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+x \|$", result.stdout, re.M)
    assert rows == ["4", "8", "16", "32", "64"], result.stdout
    assert re.search(r"^Target, 40 x 4 in under a minute: (met|missed) \(", result.stdout, re.M)
