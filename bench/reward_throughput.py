"""Reward throughput: our sandboxed reward against the straightforward pipeline, on the same programs.

The programs are the problem set's reference solutions and, for each problem, a type error, a syntax
error and a stub that fails its tests: all distinct, so no cache hit helps. The straightforward pipeline
writes each program to a file and runs `ocamlc -c`, then `ocamlc -o`, then the program, one program after
another, with no sandbox. Ours is `rewards.score_batch` on a warm worker pool (started once per training
run), with the sandbox mode the reward would use (bwrap where it runs).

    .venv/bin/python bench/reward_throughput.py [--rounds 5] [--workers 0] [--sandbox auto]
"""

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import rewards  # noqa: E402
from ocaml_sandbox import SandboxPool  # noqa: E402


def variants(problem: dict) -> dict[str, str]:
    body = problem["solution"]
    return {
        "correct": body,
        "type error": f'\n  let _ = 1 + "one" in{body}',
        "syntax error": f"{body}\n  let in",
        "failing tests": '\n  failwith "not implemented"',
    }


def programs(problems: list[dict]) -> list[dict]:
    return [
        {
            "problem": p["prompt"],
            "tests": p["tests"],
            "completion": f"{text}\n{rewards.END_MARKER}",
            "kind": kind,
        }
        for p in problems
        for kind, text in variants(p).items()
    ]


def straightforward(items: list[dict], run_timeout: float) -> float:
    """Seconds to compile, link and run every program with plain ocamlc, one after another."""
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        for i, item in enumerate(items):
            problem = rewards.parse_problem(item["problem"])
            solution = rewards.assemble_solution(
                problem, rewards.extract_code(item["completion"], problem.function)
            )
            source = Path(tmp) / f"p{i}.ml"
            source.write_text(f"{problem.types}\n{solution}\n{item['tests']}\n")
            compiled = subprocess.run(["ocamlc", "-c", source.name], cwd=tmp, capture_output=True)
            if compiled.returncode != 0:
                continue
            linked = subprocess.run(["ocamlc", "-o", f"p{i}", f"p{i}.cmo"], cwd=tmp, capture_output=True)
            if linked.returncode == 0:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    subprocess.run([f"./p{i}"], cwd=tmp, capture_output=True, timeout=run_timeout)
        return time.perf_counter() - start


def ours(items: list[dict], cfg: rewards.RewardConfig) -> tuple[float, str, list[dict]]:
    """Seconds for score_batch on a fresh, warmed-up pool (cold cache), the sandbox mode, the results."""
    pool = SandboxPool(cfg.reward_workers, cfg.ocaml_sandbox, cfg.limits())
    try:
        warm_up = [{**item, "completion": item["completion"] + "\n(* warm-up *)"} for item in items[:8]]
        rewards.score_batch(warm_up, cfg, pool=pool)
        start = time.perf_counter()
        results = rewards.score_batch(items, cfg, pool=pool)
        return time.perf_counter() - start, pool.mode, results
    finally:
        pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds of each; the median is shown")
    parser.add_argument("--workers", type=int, default=0, help="reward workers (0: one per core)")
    parser.add_argument(
        "--sandbox", default="auto", choices=("auto", "bwrap", "rlimit"), help="OCAML_SANDBOX"
    )
    args = parser.parse_args()
    # The first 50 bundled problems, x 4 variants: the 200 programs BENCHMARKS.md's figures were measured on.
    problems = [
        json.loads(line) for line in (ROOT / "data" / "problems.jsonl").read_text().splitlines()[:50] if line
    ]
    items = programs(problems)
    cfg = rewards.RewardConfig(min_non_empty_lines=0, reward_workers=args.workers, ocaml_sandbox=args.sandbox)

    # Rounds alternate between the two, so that load from other processes hits both alike.
    baseline_runs, ours_runs = [], []
    for _ in range(args.rounds):
        baseline_runs.append(straightforward(items, cfg.ocaml_run_timeout))
        ours_runs.append(ours(items, cfg))
    stages = Counter(result["stage"] for result in ours_runs[0][2])
    baseline = statistics.median(baseline_runs)
    fast = statistics.median(seconds for seconds, _, _ in ours_runs)
    n = len(items)
    print(f"{n} distinct programs ({len(problems)} problems x 4 variants); stages: {dict(stages)}")
    print(
        f"straightforward (ocamlc -c, ocamlc -o, run; sequential, no sandbox): {n / baseline:8.1f} programs/s"
    )
    workers = args.workers or "one per core"
    print(
        f"our reward (sandbox {ours_runs[0][1]}, workers {workers}):               {n / fast:8.1f} programs/s"
    )
    print(f"ratio: {baseline / fast:.1f}x")


if __name__ == "__main__":
    main()
