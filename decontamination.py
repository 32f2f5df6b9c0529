"""Training problems kept apart from every held-out set: no shared function name, and no shared behaviour.

A training problem is contaminated when it shares its function's name with a held-out problem, or when a
held-out problem's reference solution, renamed to the training function, passes every one of the training
problem's tests: then the two are one task under two names, and training on one is training on the other.
Only references of the same parameter and result types can pass, so only those are run, each in the reward's
own sandbox through the problem check (problem_check.check_problems: parallel, cached by content).

The held-out references are data/heldout.jsonl's solutions and, where MultiPL-E's even half is on disk
(../shared/multipl-e/, never copied here), data/multipl_e_solutions.jsonl's on its repaired prompts.

    python decontamination.py [TRAINING]    # one line per clash, then a summary; exit 1 when any
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from multipl_e import repair_problems, signature
from problem_check import Assemble, CheckSettings, check_problems
from problems import BUNDLED_PROBLEMS, HELDOUT_PROBLEMS, ROOT, load_rows, parse_problem, usable_problems
from rewards import RewardConfig, reference_program

MULTIPL_E_EVEN = ROOT.parent / "shared" / "multipl-e" / "humaneval-ml-even.jsonl"
MULTIPL_E_SOLUTIONS = ROOT / "data" / "multipl_e_solutions.jsonl"


def function_name(problem: Mapping) -> str:
    return parse_problem(problem["problem"]).function


def signature_types(problem: Mapping) -> tuple | None:
    """The parameter and result types as multipl_e reads them (a type variable or a type of the prompt's own
    reads as any); None where the signature cannot be read."""
    found = signature(problem["problem"])
    return tuple(found.types()) if found else None


def held_out_references() -> list[dict]:
    """Every held-out problem with a reference solution we have, as {id, problem, tests, solution}."""
    references = usable_problems(load_rows(HELDOUT_PROBLEMS), print)
    if MULTIPL_E_EVEN.is_file():
        answers = {row["name"]: row["solution"] for row in load_rows(MULTIPL_E_SOLUTIONS)}
        even, _ = repair_problems(usable_problems(load_rows(MULTIPL_E_EVEN), print), lambda text: None)
        references += [{**p, "solution": answers[p["id"]]} for p in even if p["id"] in answers]
    return references


def held_out_names() -> dict[str, str]:
    """Every held-out function name (MultiPL-E's whole even half, answered or not) -> its problem id."""
    rows = usable_problems(load_rows(HELDOUT_PROBLEMS), print)
    if MULTIPL_E_EVEN.is_file():
        rows += repair_problems(usable_problems(load_rows(MULTIPL_E_EVEN), print), lambda text: None)[0]
    return {function_name(p): p["id"] for p in rows}


def name_clashes(training: Sequence[Mapping], names: Mapping[str, str]) -> list[str]:
    return [
        f"{p['id']}: its function `{function_name(p)}` is also held-out problem {names[function_name(p)]}'s"
        for p in training
        if function_name(p) in names
    ]


def as_training_function(reference: Mapping, function: str) -> str:
    """The reference solution as a whole definition named `function`, its own parameters and types kept
    (its body reads them by name); the reward assembles a whole definition as it stands."""
    parsed = parse_problem(reference["problem"])
    head = parsed.signature.replace(parsed.function, function, 1)
    return f"{head}\n{reference['solution']}"


def behaviour_clashes(
    training: Sequence[Mapping], references: Sequence[Mapping], cfg: CheckSettings, assemble: Assemble
) -> list[str]:
    """A line for each (training problem, held-out reference) of the same types whose reference, renamed,
    passes all of the training problem's tests."""
    by_types: dict[tuple, list[Mapping]] = {}
    for reference in references:
        by_types.setdefault(signature_types(reference), []).append(reference)
    pairs = [
        (problem, reference)
        for problem in training
        if (types := signature_types(problem)) is not None
        for reference in by_types.get(types, [])
    ]
    runs = [
        {
            "id": f"{problem['id']} <- {reference['id']}",
            "problem": problem["problem"],
            "tests": problem["tests"],
            "solution": as_training_function(reference, function_name(problem)),
        }
        for problem, reference in pairs
    ]
    failed = {problem_id for problem_id, _ in check_problems(runs, cfg, assemble).broken}
    return [
        f"{run['id'].split(' <- ')[0]}: held-out problem {run['id'].split(' <- ')[1]}'s reference solution "
        "passes all of its tests"
        for run in runs
        if run["id"] not in failed
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Name training problems that overlap a held-out set.")
    parser.add_argument("training", nargs="?", type=Path, default=BUNDLED_PROBLEMS, help="a problems file")
    args = parser.parse_args(argv)
    training = usable_problems(load_rows(args.training), print)
    references = held_out_references()
    clashes = name_clashes(training, held_out_names())
    clashes += behaviour_clashes(training, references, RewardConfig(), reference_program)
    for line in clashes:
        print(line)
    source = "data/heldout.jsonl" + (" and MultiPL-E's even half" if MULTIPL_E_EVEN.is_file() else "")
    print(
        json.dumps({"training": len(training), "references": len(references), "clashes": len(clashes)}),
        f"({source})",
    )
    return 1 if clashes else 0


if __name__ == "__main__":
    sys.exit(main())
