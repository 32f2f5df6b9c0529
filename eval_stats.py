"""What an evaluation's rows say: pass@k, the summary of one evaluation, and the comparison of two with its
uncertainty (a 95% bootstrap interval of each pass@1 over problems, and the exact sign test of the problems
that improved against those that regressed). evaluate.py writes the rows; its reports, the trainer's
in-training evaluation and the benches read them here. docs/statistics.md says how to read the figures.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence

from rewards import STAGES
from run_records import figure
from stats import bootstrap_interval, sign_test

DIFFICULTY_ORDER = ("easy", "medium", "hard")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c pass (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def passed(row: Mapping) -> bool:
    """Whether a sample passed every test (older eval files hold only the reward's stage)."""
    return bool(row.get("passed", row["stage"] == "passed"))


def problem_results(rows: Sequence[dict]) -> dict[str, dict]:
    """Per problem: difficulty, samples, passed (every test), pass rate and mean reward."""
    grouped: dict[str, list[dict]] = {}
    for r in rows:
        grouped.setdefault(str(r["problem_id"]), []).append(r)
    return {
        problem_id: {
            "difficulty": str(group[0].get("difficulty", "unknown")),
            "samples": len(group),
            "passed": sum(passed(r) for r in group),
            "pass_rate": sum(passed(r) for r in group) / len(group),
            "mean_reward": statistics.fmean(r["total_reward"] for r in group),
        }
        for problem_id, group in grouped.items()
    }


def pass_rates(rows: Sequence[dict], k: int) -> dict:
    """Problems, pass@1, pass@k (averaged over problems) and mean reward (over completions) of some rows."""
    results = problem_results(rows).values()
    return {
        "problems": len(results),
        "pass@1": statistics.fmean(pass_at_k(r["samples"], r["passed"], 1) for r in results),
        f"pass@{k}": statistics.fmean(pass_at_k(r["samples"], r["passed"], k) for r in results),
        "mean_reward": statistics.fmean(r["total_reward"] for r in rows),
    }


def difficulties(rows: Sequence[dict]) -> list[str]:
    """easy, medium, hard first, any other label after them in alphabetical order."""
    present = {str(r.get("difficulty", "unknown")) for r in rows}
    return [d for d in DIFFICULTY_ORDER if d in present] + sorted(present - set(DIFFICULTY_ORDER))


def summarize(rows: Sequence[dict], k: int) -> dict:
    """pass@1, pass@k, mean reward and its std, the truncated share, stage shares, and per difficulty
    the problems, pass@1, pass@k and mean reward."""
    stages = Counter(r["stage"] for r in rows)
    return {
        "k": k,
        **pass_rates(rows, k),
        "completions": len(rows),
        "reward_std": statistics.pstdev(r["total_reward"] for r in rows),
        "truncated": sum(bool(r.get("truncated")) for r in rows) / len(rows),
        "stages": {stage: stages[stage] / len(rows) for stage in STAGES},
        "difficulty": {
            d: pass_rates([r for r in rows if str(r.get("difficulty", "unknown")) == d], k)
            for d in difficulties(rows)
        },
    }


def interval(bounds: tuple[float, float]) -> str:
    """A 95% interval as the tables print it."""
    return f"[{bounds[0]:.1%}, {bounds[1]:.1%}]"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(cells) + " |" for cells in rows)])


def compare(rows_a: Sequence[dict], rows_b: Sequence[dict]) -> dict:
    """Per problem in both, pass rate and mean reward in A and B and their deltas (B - A). A problem
    improved when its pass rate rose, or held while its mean reward rose; largest change first. With each
    pass@1 its 95% bootstrap interval over the problems (the draw of problems varies more than the draw of
    samples), and the paired test: the exact sign test of improved against regressed problems."""
    a, b = problem_results(rows_a), problem_results(rows_b)
    problems = [
        {
            "problem_id": problem_id,
            "difficulty": a[problem_id]["difficulty"],
            "pass_a": a[problem_id]["pass_rate"],
            "pass_b": b[problem_id]["pass_rate"],
            "pass_delta": b[problem_id]["pass_rate"] - a[problem_id]["pass_rate"],
            "reward_a": a[problem_id]["mean_reward"],
            "reward_b": b[problem_id]["mean_reward"],
            # Rewards are stored to 6 decimals; rounding keeps float noise from counting as a change.
            "reward_delta": round(b[problem_id]["mean_reward"] - a[problem_id]["mean_reward"], 6),
        }
        for problem_id in a
        if problem_id in b
    ]
    improved = sorted((p for p in problems if _change(p) > (0, 0)), key=_change, reverse=True)
    regressed = sorted((p for p in problems if _change(p) < (0, 0)), key=_change)
    return {
        "improved": improved,
        "regressed": regressed,
        "p": sign_test(len(improved), len(regressed)),
        "unchanged": sum(_change(p) == (0, 0) for p in problems),
        "common": len(problems),
        "only_a": sorted(set(a) - set(b)),
        "only_b": sorted(set(b) - set(a)),
        "pass_a": statistics.fmean(p["pass_a"] for p in problems) if problems else 0.0,
        "pass_b": statistics.fmean(p["pass_b"] for p in problems) if problems else 0.0,
        "reward_a": statistics.fmean(p["reward_a"] for p in problems) if problems else 0.0,
        "reward_b": statistics.fmean(p["reward_b"] for p in problems) if problems else 0.0,
        **{
            f"interval_{side}": bootstrap_interval([p[f"pass_{side}"] for p in problems])
            if problems
            else (0.0, 0.0)
            for side in "ab"
        },
    }


def _change(p: dict) -> tuple[float, float]:
    return p["pass_delta"], p["reward_delta"]


def comparison_totals(result: dict) -> str:
    points = 100 * (result["pass_b"] - result["pass_a"])
    return (
        f"{len(result['improved'])} improved, {len(result['regressed'])} regressed, "
        f"{result['unchanged']} unchanged of {result['common']} problems; pass rate "
        f"{result['pass_a']:.1%} {interval(result['interval_a'])} -> {result['pass_b']:.1%} "
        f"{interval(result['interval_b'])} ({figure(points, '+.1f')} points), mean reward "
        f"{result['reward_a']:.3f} -> {result['reward_b']:.3f} "
        f"({figure(result['reward_b'] - result['reward_a'], '+.3f')})"
        f"; sign test p = {result['p']:.2g}"
    )


def comparison_markdown(result: dict, label_a: str, label_b: str) -> str:
    header = ["problem", "difficulty", "pass rate A", "pass rate B", "delta", "reward A", "reward B", "delta"]
    parts = [f"A = {label_a}, B = {label_b}. {comparison_totals(result)}."]
    if result["only_a"] or result["only_b"]:
        parts.append(
            f"Left out, in one file only: A {', '.join(result['only_a']) or 'none'}; "
            f"B {', '.join(result['only_b']) or 'none'}."
        )
    for title in ("improved", "regressed"):
        rows = [
            [
                p["problem_id"],
                p["difficulty"],
                f"{p['pass_a']:.0%}",
                f"{p['pass_b']:.0%}",
                f"{figure(100 * p['pass_delta'], '+.0f')} pts",
                f"{p['reward_a']:.3f}",
                f"{p['reward_b']:.3f}",
                figure(p["reward_delta"], "+.3f"),
            ]
            for p in result[title]
        ]
        parts.append(
            f"{title.capitalize()} ({len(rows)}):\n\n{markdown_table(header, rows)}"
            if rows
            else f"{title.capitalize()}: none."
        )
    return "\n\n".join(parts)
