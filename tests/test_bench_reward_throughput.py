"""bench/reward_throughput.py runs as BENCHMARKS.md says: both pipelines score the same 200 programs alike."""

import re


def test_one_round_scores_every_program_and_prints_the_ratio(run_python) -> None:
    result = run_python("bench/reward_throughput.py", "--rounds", "1", timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    stages = "{'passed': 50, 'type_error': 50, 'syntax_error': 50, 'runtime_error': 50}"
    assert f"stages: {stages}" in result.stdout
    assert re.search(r"^ratio: \d+\.\dx$", result.stdout, re.M), result.stdout
