"""Problems: reading a problem's prompt, and loading and validating dataset rows once for every caller.

A row is {id (or name), prompt (or problem), tests, solution?, difficulty?}. `usable_problems` is the one
validator: the scoring CLI (`rewards.py score`), training, SFT and evaluation all keep and skip the same rows,
each skipped row named with its reason. Torch-free: `datasets` is imported only where a dataset loads.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import hub
from envflags import ConfigError
from multipl_e import choose_split, split_source

ROOT = Path(__file__).resolve().parent
BUNDLED_PROBLEMS = ROOT / "data" / "problems.jsonl"
DEMO_PROBLEMS = ROOT / "data" / "demo_problems.jsonl"
DEMO_SFT = ROOT / "data" / "demo_sft.jsonl"
DEMO_HELDOUT = ROOT / "data" / "demo_heldout.jsonl"  # a dozen unseen problems of the demo's kinds
HELDOUT_PROBLEMS = ROOT / "data" / "heldout.jsonl"

IDENT = r"[a-z_][A-Za-z0-9_']*"
# A function's name as a prompt may spell it: MultiPL-E's translator keeps Python's capitals
# (`let Strongest_Extension ...`), which OCaml rejects. Read, the problem is checked (and named broken) like
# any other, and REPAIR_PROBLEMS=1 can repair it (multipl_e.py).
FUNCTION = r"[A-Za-z_][A-Za-z0-9_']*"
TYPE_NAME = re.compile(rf"^(?:type|and)\s+(?:nonrec\s+)?(?:'\w+\s+|\([^)]*\)\s+)?({IDENT})", re.M)
# A prompt's own exceptions count as its types: a completion that restates one would define a second
# exception of the same name, which the tests' handlers do not catch.
EXCEPTION_NAME = re.compile(r"^exception\s+([A-Z][A-Za-z0-9_']*)", re.M)
ESCAPED_LINE_BREAK = re.compile(r"\\\\|\\n")


@dataclass(frozen=True)
class Problem:
    types: str  # everything before the signature: doc comment, type definitions
    signature: str  # `let [rec] f (x : t) ... : r =`
    function: str
    type_names: frozenset[str]  # its type definitions' names and its exceptions'


def parse_problem(text: str) -> Problem:
    """Split a problem prompt at its final top-level `let`; ValueError when it has none."""
    signatures = list(re.finditer(rf"^let\s+(rec\s+)?({FUNCTION})\b", text, re.M))
    if not signatures:
        raise ValueError("the problem has no signature line `let f ... =`")
    match = signatures[-1]
    types = text[: match.start()]
    names = frozenset(TYPE_NAME.findall(types) + EXCEPTION_NAME.findall(types))
    return Problem(types, text[match.start() :].strip(), match.group(2), names)


def unescape_line_breaks(text: str) -> str:
    """A prompt or tests field with its line breaks: a text with no line break but the two characters `\\n`
    (how some CSV exports write one) gets each of them back as a line break."""
    if "\n" in text:
        return text
    return ESCAPED_LINE_BREAK.sub(lambda m: "\n" if m.group() == "\\n" else m.group(), text)


def problem_and_tests(row: Mapping, need_tests: bool = True) -> tuple[str, str]:
    """(prompt, tests) of a dataset row, line breaks unescaped; ValueError naming what the row lacks.
    Without `need_tests` (SFT reads only prompt and solution) a row without tests gets ""."""
    problem = row.get("prompt") if row.get("prompt") is not None else row.get("problem")
    tests = row.get("tests")
    if not isinstance(problem, str) or not problem.strip():
        raise ValueError("no prompt (or problem) text")
    if not isinstance(tests, str) or not tests.strip():
        if need_tests:
            raise ValueError("no tests")
        tests = ""
    problem = unescape_line_breaks(problem).strip()
    parse_problem(problem)  # the reward's own reading of a prompt: it needs a final `let f ... =`
    return problem, unescape_line_breaks(tests)


def load_rows(path: Path) -> list[dict]:
    """Rows of a JSONL, CSV or parquet file."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    rows = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise SystemExit(f"{path}:{number}: not JSON ({exc.msg})") from None
                if not isinstance(row, dict):
                    raise SystemExit(f"{path}:{number}: not a JSON object")
                rows.append(row)
    return rows


def usable_problems(
    rows: Iterable[Mapping], warn: Callable[[str], None], *, for_sft: bool = False, need_id: bool = False
) -> list[dict]:
    """The rows every caller can use, as {id, problem, tests, solution, difficulty}; each other row named
    through `warn` with its reason and left out. `solution` is None and `difficulty` "unknown" where a row
    has none; `for_sft` needs a solution and no tests; `need_id` refuses a row without an id (the scoring
    CLI matches completions to problems by id), where the others call it "row N"."""
    problems, seen = [], set()
    for index, row in enumerate(rows):
        # MultiPL-E names its problems in `name` (multipl_e.py).
        row_id = row.get("id") if row.get("id") not in (None, "") else row.get("name")
        has_id = row_id not in (None, "")
        problem_id = str(row_id) if has_id else f"row {index}"
        try:
            if need_id and not has_id:
                raise ValueError("no id")
            if problem_id in seen:
                raise ValueError("duplicate id")
            problem, tests = problem_and_tests(row, need_tests=not for_sft)
            solution = row.get("solution")
            has_solution = isinstance(solution, str) and bool(solution.strip())
            if for_sft and not has_solution:
                raise ValueError("no solution to train on")
        except ValueError as err:
            warn(f"skipped problem {problem_id}: {err}")
            continue
        seen.add(problem_id)
        problems.append(
            {
                "id": problem_id,
                "problem": problem,
                "tests": tests,
                "solution": unescape_line_breaks(solution) if has_solution else None,
                "difficulty": str(row.get("difficulty") or "unknown"),
            }
        )
    return problems


DATASET_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}

# MultiPL-E and MultiPL-T are licensed "BSD 3-Clause License with Machine Learning Restriction" (the
# repositories' LICENSE files; the hub's dataset card says MIT, the licence file binds): evaluation only.
EVALUATION_ONLY_HUB = re.compile(r"^nuprl/multipl-[et]\b", re.IGNORECASE)
BENCHMARK_NAME = re.compile(r"^(?:HumanEval|mbpp)_\d+_")  # MultiPL-E's problem names, as its rows hold them
MULTIPL_E_COLUMNS = frozenset({"language", "stop_tokens"})  # its native columns that ours never have


class EvaluationOnlyData(ConfigError):
    """Training or SFT asked for data whose licence forbids training on it."""

    def __init__(self, setting_name: str, source: str):
        super().__init__(
            f"{setting_name}={source!r} is MultiPL-E data, which is for evaluation only: clause 4 of its "
            "licence (BSD 3-Clause with Machine Learning Restriction) says its contents may not be used as "
            "training data for any machine learning model; evaluate on it with "
            f"`evaluate.py MODEL --problems {source} --protocol multipl-e`"
        )


def is_evaluation_only(columns: Iterable[str], names: Iterable[object]) -> bool:
    """Rows in MultiPL-E's native columns, or named as its problems are (our solutions to them included)."""
    return set(columns) >= MULTIPL_E_COLUMNS or any(BENCHMARK_NAME.match(str(name)) for name in names)


def load_problems(
    source: str,
    warn: Callable[[str], None] = print,
    *,
    for_sft: bool = False,
    setting_name: str = "TRAINING_DATASET",
    to_train: bool = False,
) -> list[dict]:
    """Rows {id, problem, tests, solution, difficulty} from a hub id or a local file or folder; malformed
    rows reported, skipped. `solution` is None and `difficulty` "unknown" where a row has none; `for_sft`
    needs a solution and no tests. Line breaks are read as the scoring CLI reads them (a CSV export's
    `\\n`). An error names `setting_name`, where the source came from. With `to_train` (GRPO and SFT data),
    MultiPL-E's data is refused before anything is downloaded or trained: EvaluationOnlyData."""
    if to_train and EVALUATION_ONLY_HUB.match(source):
        raise EvaluationOnlyData(setting_name, source)
    import datasets

    datasets.disable_progress_bars()
    path = Path(source).expanduser()
    try:
        if path.is_file():
            builder = DATASET_BUILDERS.get(path.suffix)
            if builder is None:
                raise ConfigError(
                    f"{setting_name}={source!r}: expected a .jsonl, .json, .csv or .parquet file"
                )
            rows = datasets.load_dataset(builder, data_files=str(path), split="train")
        else:  # a folder or a hub id, which may name a config and a split: nuprl/MultiPL-E:humaneval-ml
            dataset, name, split = split_source(str(path) if path.is_dir() else source)
            splits = datasets.load_dataset(dataset, name)
            rows = splits[choose_split(list(splits), split, source)]
    except ConfigError:
        raise
    except Exception as err:  # datasets raises many types; the cause is what the user needs
        if hub.unreachable(err):
            raise ConfigError(
                hub.unreachable_message(f"{setting_name}={source!r}", "it", hub.OFFLINE_DATA)
            ) from None
        cause = err.__cause__ or err
        raise ConfigError(
            f"{setting_name}={source!r}: cannot load it ({type(cause).__name__}: {cause})"
        ) from None
    names = rows["name"] if "name" in rows.column_names else ()
    if to_train and is_evaluation_only(rows.column_names, names):
        raise EvaluationOnlyData(setting_name, source)
    return usable_problems(rows, warn, for_sft=for_sft)


def bundled_path(name: str) -> str:
    """A relative path that is not there from the working directory but is in the repository (the default
    GRPO_EVAL_DATASET, data/heldout.jsonl) resolves to the repository's copy."""
    if not Path(name).expanduser().exists() and (ROOT / name).exists():
        return str(ROOT / name)
    return name
