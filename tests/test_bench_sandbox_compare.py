"""bench/sandbox_compare.py runs as BENCHMARKS.md says: two checkouts' sandboxes score the programs alike."""

import re

from problems import ROOT


def test_one_round_against_this_checkout_scores_alike_and_prints_both_ratios(run_python) -> None:
    result = run_python("bench/sandbox_compare.py", str(ROOT), "--rounds", "1", "--workers", "1", timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    passed = re.findall(r"tests passed \{(\d+)\}", result.stdout)
    assert len(passed) == 2 and passed[0] == passed[1] and int(passed[0]) > 0, result.stdout
    assert re.search(r"^this/other: throughput \d+\.\d\dx, CPU \d+\.\d\dx$", result.stdout, re.M), (
        result.stdout
    )
