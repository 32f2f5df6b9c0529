"""MultiPL-E (the HumanEval and MBPP translations that code-model papers report) as a problem source.

Its rows name the problem in `name` and hold `prompt` (a doc comment and `let f (x : t) : r =`) and `tests`
(`let assertions = let candidate = f in (assert ...); ... ()`): problems.load_problems reads them as it reads
ours. On the hub it is one dataset with a config per benchmark and language and only a `test` split, so a
source may carry them: `nuprl/MultiPL-E:humaneval-ml`, `nuprl/MultiPL-E:mbpp-ml:test`. A local export in
MultiPL-E's own columns (JSONL, JSON or parquet) loads offline like any problems file.

Two things here are MultiPL-E's, not ours:
- Known rendering bugs of its OCaml translator (its issue #167): a negative integer written `(~5)` (a
  syntax error: OCaml's negation is `-` or `~-`), `(~5).0` for a negative float, and a float written `.5`.
  They are repaired only when asked (REPAIR_PROBLEMS=1), each repair counted: unrepaired, the benchmark is
  the one published numbers were measured on; repaired, it measures the model rather than the translator.
- Its evaluation protocol (`evaluate.py --protocol multipl-e`): the prompt as a raw continuation without a
  chat template, cut at its stop sequences, sampled as its completion script does. `Protocol` holds its
  settings and `stop_at_stop_sequence` its cut; evaluate.sample_continuations samples with them.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

# A hub id with a config and an optional split: `owner/name:config[:split]`.
HUB_SOURCE = re.compile(r"^(?P<id>[\w.-]+(?:/[\w.-]+)?):(?P<config>[\w.-]+)(?::(?P<split>[\w.-]+))?$")

NEGATIVE_LITERAL = re.compile(r"\(~(\d+)\)(\.\d*)?")  # `(~5)`, and `(~5).0` where a float was wanted
LEADING_DOT_FLOAT = re.compile(r"(?<![\w.)\]'\"])\.(\d)")  # `.5`, not `x.5`, `a.(5)` or `1.5`
CHAR_LITERAL = re.compile(r"'(?:\\(?:\d{3}|x[0-9a-fA-F]{2}|.)|[^\\'\n])'")
REPAIRS = {"negative literal `(~N)`": NEGATIVE_LITERAL, "float `.N`": LEADING_DOT_FLOAT}


@dataclass(frozen=True)
class Protocol:
    """MultiPL-E's sampling, as its completion script (multipl_e/completions.py) and tutorial run it."""

    temperature: float = 0.2
    top_p: float = 0.95
    max_new_tokens: int = 512
    samples: int = 20  # the tutorial's pass@1 estimate; the paper drew 200 per problem
    # The OCaml translator's stop sequences (dataset_builder/humaneval_to_ml.py), also each row's stop_tokens.
    stop: tuple[str, ...] = ("\n\n", "\n(*", "\ntype", "\nlet")


MULTIPL_E = Protocol()
MULTIPL_E_GREEDY = Protocol(temperature=0.0, samples=1)  # greedy decoding: pass@1 from one completion


# --- sources ----------------------------------------------------------------------------------------------


def split_source(source: str) -> tuple[str, str | None, str | None]:
    """(dataset, config, split) of `owner/name:config[:split]`; anything else, an existing path included,
    comes back whole with no config and no split."""
    match = HUB_SOURCE.match(source)
    if match is None or Path(source).expanduser().exists():
        return source, None, None
    return match["id"], match["config"], match["split"]


def choose_split(available: Sequence[str], wanted: str | None, source: str) -> str:
    """The split asked for; else `train`, else the only split there is (MultiPL-E has only `test`).
    ValueError naming the splits when the choice is not clear."""
    if wanted is not None:
        if wanted not in available:
            raise ValueError(f"{source}: no split {wanted!r} (it has {', '.join(available)})")
        return wanted
    if "train" in available:
        return "train"
    if len(available) == 1:
        return available[0]
    raise ValueError(f"{source}: several splits ({', '.join(available)}); name one as ID:CONFIG:SPLIT")


# --- repairs ----------------------------------------------------------------------------------------------


def code_spans(text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of the stretches of OCaml source outside string and character literals and comments,
    so that a repair never touches `"(~5)"` in a string or a comment."""
    start = i = 0
    depth = 0  # comment nesting
    n = len(text)
    while i < n:
        if text.startswith("(*", i):
            if depth == 0 and i > start:
                yield start, i
            depth += 1
            i += 2
        elif depth and text.startswith("*)", i):
            depth -= 1
            i += 2
            start = i
        elif text[i] == '"':  # a string, inside a comment too (OCaml lexes them there)
            if depth == 0 and i > start:
                yield start, i
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            if depth == 0:
                start = i
        elif text[i] == "'" and (char := CHAR_LITERAL.match(text, i)):  # not a type variable's quote
            if depth == 0 and i > start:
                yield start, i
            i = char.end()
            if depth == 0:
                start = i
        else:
            i += 1
    if depth == 0 and start < n:
        yield start, n


def repair_tests(tests: str) -> tuple[str, Counter]:
    """The tests with MultiPL-E's known rendering bugs repaired, and how many of each were."""
    counts: Counter = Counter()
    parts, last = [], 0
    for start, end in code_spans(tests):
        code = tests[start:end]
        code, negatives = NEGATIVE_LITERAL.subn(lambda m: f"(-{m[1]}{m[2] or ''})", code)
        code, floats = LEADING_DOT_FLOAT.subn(r"0.\1", code)
        counts.update({name: c for name, c in zip(REPAIRS, (negatives, floats), strict=True) if c})
        parts += [tests[last:start], code]
        last = end
    return "".join([*parts, tests[last:]]), counts


def describe(counts: Counter) -> str:
    """`2 negative literals `(~N)`, 1 float `.N``"""
    words = [f"{c} {name.replace(' `', 's `', 1) if c > 1 else name}" for name, c in counts.items()]
    return ", ".join(words) or "nothing"


def repair_problems(problems: list[dict], note: Callable[[str], None] = print) -> tuple[list[dict], Counter]:
    """Problems with their tests repaired, each repaired problem and the totals named through `note`."""
    total: Counter = Counter()
    repaired_problems, out = 0, []
    for problem in problems:
        tests, counts = repair_tests(problem["tests"])
        if counts:
            repaired_problems += 1
            total.update(counts)
            note(f"repaired problem {problem['id']}: {describe(counts)}")
            problem = {**problem, "tests": tests}
        out.append(problem)
    if repaired_problems:
        note(
            f"REPAIR_PROBLEMS: {describe(total)} repaired in {repaired_problems} of {len(problems)} problems"
        )
    return out, total


def repair_hint(tests: str) -> str:
    """For a broken problem's error line: where its tests hold a bug REPAIR_PROBLEMS=1 repairs, if any."""
    found = [
        (start + m.start(), m[0])
        for start, end in code_spans(tests)
        for pattern in REPAIRS.values()
        for m in pattern.finditer(tests[start:end])
    ]
    if not found:
        return ""
    offset, text = min(found)
    line = tests.count("\n", 0, offset) + 1
    return f" (tests line {line}: `{text}`, a known MultiPL-E rendering bug; REPAIR_PROBLEMS=1 repairs it)"


# --- MultiPL-E's protocol ---------------------------------------------------------------------------------


def stop_at_stop_sequence(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """The text up to the first stop sequence, and whether there was one."""
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    return (text, False) if cut < 0 else (text[:cut], True)
