"""This checkout's sandbox against another checkout's, side by side in one process.

For a change to ocaml_sandbox.py or ocaml/: the same 200 programs as bench/reward_throughput.py (reference
solutions, type errors, syntax errors, failing stubs), scored by a fresh pool of each sandbox in turn, rounds
alternating which goes first, so that load from other processes hits both alike. Reported: the medians of
wall-clock seconds and of CPU seconds, the latter summed over every process of the pool (its checkers,
runners and their test programs, read from /proc before the pool closes), which other jobs on a shared
machine disturb far less. The other checkout is any earlier revision:

    git archive HEAD | tar -x -C /tmp/before
    .venv/bin/python bench/sandbox_compare.py /tmp/before [--rounds 9] [--workers 0] [--sandbox bwrap]
"""

import argparse
import importlib.util
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reward_throughput import programs  # noqa: E402

import rewards  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def sandbox_module(name: str, checkout: Path) -> ModuleType:
    """A checkout's ocaml_sandbox.py under its own name (it finds its OCaml sources beside itself)."""
    spec = importlib.util.spec_from_file_location(name, checkout / "ocaml_sandbox.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def descendants_cpu() -> float:
    """CPU seconds of every live descendant of this process, with those of the children each reaped."""
    parents, seconds = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(stat.parent.name)
        parents[pid], seconds[pid] = int(fields[1]), sum(int(x) for x in fields[11:15]) / TICK
    me, total = os.getpid(), 0.0
    for pid in parents:
        ancestor = pid
        while ancestor in parents and ancestor != me:
            ancestor = parents[ancestor]
        total += seconds[pid] if ancestor == me else 0.0
    return total


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def one_round(sandbox: ModuleType, jobs: list[tuple], workers: int, mode: str) -> tuple[float, float, int]:
    """Wall-clock and CPU seconds for a fresh, warmed-up pool to score every job, and the tests passed."""
    start_cpu = own_cpu()
    pool = sandbox.SandboxPool(workers, mode, sandbox.Limits())
    try:
        pool.evaluate_many([sandbox.Job(t, f"{c}\n(* warm-up *)", s, f) for t, c, s, f in jobs[:8]])
        start = time.perf_counter()
        outcomes = pool.evaluate_many([sandbox.Job(*job) for job in jobs])
        seconds = time.perf_counter() - start
        cpu = descendants_cpu() + own_cpu() - start_cpu
    finally:
        pool.close()
    return seconds, cpu, sum(o.tests_passed for o in outcomes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "other", type=Path, help="the other checkout (a folder with ocaml_sandbox.py, ocaml/)"
    )
    parser.add_argument("--rounds", type=int, default=9, help="rounds of each; the medians are shown")
    parser.add_argument("--workers", type=int, default=0, help="reward workers (0: one per core)")
    parser.add_argument("--sandbox", default="bwrap", choices=("bwrap", "rlimit"), help="OCAML_SANDBOX")
    args = parser.parse_args()
    sandboxes = {
        "other": sandbox_module("sandbox_other", args.other),
        "this": sandbox_module("sandbox_this", ROOT),
    }
    problems = [
        json.loads(line) for line in (ROOT / "data" / "problems.jsonl").read_text().splitlines() if line
    ]
    cfg = rewards.RewardConfig(min_non_empty_lines=0)
    items = programs(problems)
    prepared = [rewards.prepare(i["problem"], i["tests"], i["completion"], False, cfg) for i in items]
    jobs = [(p.job.types, p.job.code, p.job.tests, p.job.function) for p in prepared if p.job]
    runs: dict[str, list[tuple[float, float, int]]] = {name: [] for name in sandboxes}
    for round_index in range(args.rounds):
        order = list(sandboxes) if round_index % 2 == 0 else list(reversed(sandboxes))
        for name in order:
            runs[name].append(one_round(sandboxes[name], jobs, args.workers, args.sandbox))
    workers = args.workers or "one per core"
    print(
        f"{len(jobs)} programs, sandbox {args.sandbox}, workers {workers}, {args.rounds} rounds alternating"
    )
    wall = {name: statistics.median(r[0] for r in rs) for name, rs in runs.items()}
    cpu = {name: statistics.median(r[1] for r in rs) for name, rs in runs.items()}
    for name, label in (("other", f"other ({args.other})"), ("this", "this checkout")):
        passed = {r[2] for r in runs[name]}
        print(
            f"{label}: {len(jobs) / wall[name]:.1f} programs/s, {cpu[name]:.2f} CPU s; tests passed {passed}"
        )
    print(
        f"this/other: throughput {wall['other'] / wall['this']:.2f}x, CPU {cpu['this'] / cpu['other']:.2f}x"
    )


if __name__ == "__main__":
    main()
