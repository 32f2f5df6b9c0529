"""The problem check on 1,000 problems: cold (nothing cached, the worker pool started) and cached.

The problems are the bundled ones (data/problems.jsonl and data/heldout.jsonl, each with a reference
solution), copied with the function renamed in prompt, tests and solution (`count_vowels` -> `count_vowels_7`)
until there are 1,000, so that every one is distinct content and nothing is served from a cache in the cold
run. Each problem costs two sandboxed jobs cold: the tests against a stub, the reference solution against the
tests. The cache is a fresh temporary file, so the user's own is neither read nor written.

Measured twice: in this process (check_problems, as train.py calls it), and as a user runs it, `rewards.py
check` on the problems written to a JSONL file, a new process each time (start-up and imports included).

    .venv/bin/python bench/check_problems.py [--problems 1000] [--workers 0] [--sandbox auto]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from problem_check import check_problems  # noqa: E402
from problems import parse_problem  # noqa: E402
from rewards import RewardConfig, reference_program  # noqa: E402


def bundled() -> list[dict]:
    rows = []
    for name in ("problems.jsonl", "heldout.jsonl"):
        for line in (ROOT / "data" / name).read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            rows.append(
                {
                    "id": row["id"],
                    "problem": row["prompt"],
                    "tests": row["tests"],
                    "solution": row["solution"],
                }
            )
    return rows


def renamed(problem: dict, copy: int) -> dict:
    """The problem with its function called `<name>_<copy>` everywhere it is named."""
    name = parse_problem(problem["problem"]).function
    rename = re.compile(rf"\b{re.escape(name)}\b")
    new = f"{name}_{copy}"
    return {
        "id": f"{problem['id']}_{copy}",
        **{key: rename.sub(new, problem[key]) for key in ("problem", "tests", "solution")},
    }


def problems(count: int) -> list[dict]:
    base = bundled()
    return [renamed(base[i % len(base)], i // len(base)) for i in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=0, help="sandbox workers (0: one per core)")
    parser.add_argument("--sandbox", default="auto", choices=("auto", "bwrap", "rlimit"))
    args = parser.parse_args()
    cfg = RewardConfig(reward_workers=args.workers, ocaml_sandbox=args.sandbox)
    todo = problems(args.problems)
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "problem-check.jsonl"
        cold = check_problems(todo, cfg, reference_program, cache=cache)
        cached = check_problems(todo, cfg, reference_program, cache=cache)
        assert cold.broken == cached.broken
        print(f"{len(todo)} problems, {cold.summary()}; broken: {cold.broken[:3]}")
        for label, result in (("in-process cold", cold), ("in-process cached", cached)):
            rate = len(todo) / result.seconds
            print(f"{label}: {result.seconds:.2f} s ({result.cached} verdicts cached), {rate:.0f} problems/s")
        print(f"in-process ratio: {cold.seconds / cached.seconds:.0f}x")

        data = Path(tmp) / "problems.jsonl"
        data.write_text("".join(json.dumps({**p, "prompt": p.pop("problem")}) + "\n" for p in todo))
        env = {**os.environ, "XDG_CACHE_HOME": str(Path(tmp) / "cli-cache")}
        command = [sys.executable, "rewards.py", "check", str(data), "--reward-workers", str(args.workers)]
        command += ["--ocaml-sandbox", args.sandbox]
        seconds = []
        for label in ("rewards.py check, cold", "rewards.py check, cached"):
            started = time.monotonic()
            done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
            seconds.append(time.monotonic() - started)
            print(f"{label}: {seconds[-1]:.2f} s, {done.stdout.splitlines()[-1]}")
        print(f"rewards.py check ratio: {seconds[0] / seconds[1]:.0f}x")


if __name__ == "__main__":
    main()
