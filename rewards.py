"""The syntax-aware reward: how far a completion gets through the real OCaml toolchain.

    structural 0.05  the completion ends with (* END *)
    type-check 0.20  graded by the number of independent errors; a syntax error earns nothing (with
                     REWARD_SYNTAX_CREDIT=1, a little when at most 3 token edits make it parse)
    compile    0.10  the program with its test harness builds; partial credit when it does not
    tests      0.65  x assertions passed / assertions, only when it compiled

A completion with fewer than MIN_NON_EMPTY_LINES code lines earns 0 unless it passes every test (the gate
guards partial credit, never correctness); one that hit the length limit without the END marker is multiplied
by RUNAWAY_PENALTY_MULTIPLIER. With REWARD_CURRICULUM=1 the weights follow three phases by epoch. The
toolchain work runs in ocaml_sandbox's worker pool, so the TRL-facing callable is async and a batch is
scored concurrently.

    python rewards.py score PROBLEMS COMPLETIONS    # one JSON object per completion (no torch needed)
    python rewards.py check PROBLEMS                # each broken problem (problem_check.py), N of M usable
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import itertools
import json
import os
import re
import sys
import textwrap
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import envflags
from envflags import ConfigError, setting
from multipl_e import repair_problems
from ocaml_sandbox import Job, Limits, Outcome, SandboxPool, first_failure
from problem_check import check_source
from problems import EXCEPTION_NAME, TYPE_NAME, Problem, load_rows, parse_problem, usable_problems

END_MARKER = "(* END *)"
STAGES = (
    "gated",
    "syntax_error",
    "type_error",
    "compile_error",
    "timeout",
    "runtime_error",
    "tests_failed",
    "passed",
)
PREVIEW_CHARS = 200


def _check_boundaries(text: str) -> str | None:
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        return "expected comma-separated epochs, e.g. 0.5,1.0"
    if values != sorted(values) or any(v < 0 for v in values):
        return "expected increasing, non-negative epochs, e.g. 0.5,1.0"
    return None


def _parse_phases(text: str) -> list[tuple[float, float, float, float]]:
    phases = []
    for phase in text.split(";"):
        values = tuple(float(x) for x in phase.split(","))
        if len(values) != 4 or any(v < 0 for v in values) or abs(sum(values) - 1.0) > 1e-6:
            raise ValueError(phase)
        phases.append(values)
    return phases


def _check_phases(text: str) -> str | None:
    try:
        _parse_phases(text)
    except ValueError as exc:
        return (
            f"phase {exc!s:.40} must be 4 non-negative weights that sum to 1 (structural,type,compile,tests)"
        )
    return None


@dataclass
class RewardConfig:
    min_non_empty_lines: int = setting(
        8,
        "MIN_NON_EMPTY_LINES",
        "fewer non-empty, non-comment code lines than this earn reward 0 unless every test passes",
        low=0,
    )
    runaway_penalty_multiplier: float = setting(
        0.3,
        "RUNAWAY_PENALTY_MULTIPLIER",
        "reward multiplier for a completion that hit the length limit without the END marker",
        low=0,
        high=1,
    )
    reward_weight_structural: float = setting(
        0.05, "REWARD_WEIGHT_STRUCTURAL", "weight: ends with END", low=0
    )
    reward_weight_type_check: float = setting(0.20, "REWARD_WEIGHT_TYPE_CHECK", "weight: type-checks", low=0)
    reward_weight_compile: float = setting(
        0.10, "REWARD_WEIGHT_COMPILE", "weight: compiles with tests", low=0
    )
    reward_weight_tests: float = setting(0.65, "REWARD_WEIGHT_TESTS", "weight: share of tests passed", low=0)
    reward_curriculum: bool = setting(
        False, "REWARD_CURRICULUM", "weights follow the curriculum phases by epoch instead of the four above"
    )
    reward_curriculum_boundaries: str = setting(
        "0.5,1.0",
        "REWARD_CURRICULUM_BOUNDARIES",
        "epochs where the next phase starts",
        check=_check_boundaries,
    )
    reward_curriculum_weights: str = setting(
        "0.10,0.40,0.30,0.20;0.05,0.25,0.20,0.50;0.05,0.20,0.10,0.65",
        "REWARD_CURRICULUM_WEIGHTS",
        "per phase, ';'-separated: structural,type_check,compile,tests weights",
        check=_check_phases,
    )
    reward_syntax_credit: bool = setting(
        False,
        "REWARD_SYNTAX_CREDIT",
        "a syntax error that r <= 3 single-token edits make parse earns 0.25 / r of the type-check weight, "
        "divided by the repaired text's type errors (docs/reward.md#syntax-credit)",
    )
    ocaml_sandbox: str = setting(
        "auto",
        "OCAML_SANDBOX",
        "bwrap: bubblewrap sandbox; rlimit: limits only; auto: bwrap if it runs",
        choices=("auto", "bwrap", "rlimit"),
    )
    reward_workers: int = setting(0, "REWARD_WORKERS", "sandboxed OCaml workers (0: one per CPU core)", low=0)
    ocaml_compile_timeout: float = setting(
        10.0,
        "OCAML_COMPILE_TIMEOUT",
        "seconds to type-check and compile one completion",
        low=0,
        strict_low=True,
    )
    ocaml_run_timeout: float = setting(
        5.0, "OCAML_RUN_TIMEOUT", "seconds for one completion's tests to run", low=0, strict_low=True
    )
    ocaml_memory_mb: int = setting(
        1024, "OCAML_MEMORY_MB", "address-space limit of a test program (MiB)", low=64
    )
    repair_problems: bool = setting(
        False,
        "REPAIR_PROBLEMS",
        "repair MultiPL-E's known rendering bugs in prompts and tests ((~N), .N floats, quotes in comments, "
        "capitalised names, pair and tuple list types, Some(None)), each counted; off keeps scores "
        "comparable with published ones",
    )

    def __post_init__(self) -> None:
        total = self.stage_weights()
        if abs(sum(total) - 1.0) > 1e-6:
            raise ConfigError(
                f"REWARD_WEIGHT_STRUCTURAL/_TYPE_CHECK/_COMPILE/_TESTS must sum to 1, got {sum(total):g}"
            )
        boundaries = self.boundaries()
        if len(_parse_phases(self.reward_curriculum_weights)) != len(boundaries) + 1:
            raise ConfigError(
                f"REWARD_CURRICULUM_WEIGHTS needs {len(boundaries) + 1} phases for "
                f"REWARD_CURRICULUM_BOUNDARIES={self.reward_curriculum_boundaries!r}"
            )

    def stage_weights(self) -> tuple[float, float, float, float]:
        return (
            self.reward_weight_structural,
            self.reward_weight_type_check,
            self.reward_weight_compile,
            self.reward_weight_tests,
        )

    def boundaries(self) -> list[float]:
        return [float(x) for x in self.reward_curriculum_boundaries.split(",")]

    def weights_at(self, epoch: float) -> tuple[float, float, float, float]:
        """(structural, type_check, compile, tests) weights for this epoch."""
        if not self.reward_curriculum:
            return self.stage_weights()
        phase = sum(epoch >= b for b in self.boundaries())
        return _parse_phases(self.reward_curriculum_weights)[phase]

    def limits(self) -> Limits:
        return Limits(self.ocaml_compile_timeout, self.ocaml_run_timeout, self.ocaml_memory_mb)


# --- from problem and completion to a program ------------------------------------------------------

FENCE_OPEN = re.compile(r"```[ \t]*[A-Za-z0-9_+-]*[ \t]*\n")
TOP_LEVEL = re.compile(r"^(?:let|type|module|exception|open|include|external|class|\(\*)\b", re.M)
PROSE = re.compile(r"^[A-Z][\w'!,]*(?:[ \t]+[\w',()`!-]+)+[ \t]*[:.!]?[ \t]*$")
ENGLISH = re.compile(r"\b(?:is|are|the|here|this|solution|code|answer|implementation|following|sure)\b", re.I)
ENDS_WITH_IN = re.compile(r"\bin\s*\Z")
# A `\\` (OCaml's escaped backslash) is matched whole, so the `n` after it never reads as a line break.


def completion_text(completion: Any) -> str:
    """Plain text of a plain or conversational completion."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(str(m.get("content") or "") for m in completion if isinstance(m, dict))
    if isinstance(completion, dict):
        return str(completion.get("content") or "")
    return "" if completion is None else str(completion)


def ends_with_marker(text: str) -> bool:
    """The structural check: END is the last thing, a closing fence and white space aside."""
    tail = text.rstrip()
    if tail.endswith("```"):
        tail = tail[:-3].rstrip()
    return tail.endswith(END_MARKER)


def extract_code(text: str, function: str) -> str:
    """The code of a completion, cut at END and dedented: the first fenced block that defines `function`,
    else the first fenced block, else the text after leading prose lines. A reply often adds a block
    with a usage example, before or after the answer; a body-only answer defines nothing, so the first
    block it is."""
    text = text.replace("\r\n", "\n")
    blocks = [_as_code(block) for block in _fenced_blocks(text)]
    if blocks:
        return next((code for code in blocks if own_definition(code, function) is not None), blocks[0])
    lines = text.split("\n")
    while lines and (not lines[0].strip() or _is_prose(lines[0].strip())):
        lines.pop(0)
    return _as_code("\n".join(lines))


def _fenced_blocks(text: str) -> list[str]:
    """What each fenced block holds; a closing fence may end a line of code, the last one may be missing."""
    blocks = []
    fence = FENCE_OPEN.search(text)
    while fence:
        close = text.find("```", fence.end())
        if close < 0:
            return [*blocks, text[fence.end() :]]
        blocks.append(text[fence.end() : close])
        fence = FENCE_OPEN.search(text, close + 3)
    return blocks


def _as_code(chunk: str) -> str:
    """The chunk cut at END, without the indentation all its lines share (a block inside a list item has
    some), so that its top-level definitions start their lines as assemble_solution expects."""
    return textwrap.dedent(chunk.split(END_MARKER, 1)[0]).rstrip()


def own_definition(code: str, function: str) -> int | None:
    """Where the line with the completion's own `let [rec] f` starts: the first code line, or a later line
    that starts with it after code that does not end with `in` (in a body-only answer, `let f = ... in`
    is a local value). One pass over the lines: this runs on every completion."""
    # `let rec rec f`, a real model's slip, is still its own definition: its syntax error, not a body.
    definition = re.compile(rf"([ \t]*)let\s+(rec\s+)*{re.escape(function)}\b")
    offset, previous = 0, None  # previous: the last line that holds code, its comments removed
    # strip_comments keeps every line break, so the two lists line up.
    for line, code_line in zip(code.split("\n"), strip_comments(code).split("\n"), strict=True):
        match = definition.match(line) if definition.match(code_line) else None  # not inside a comment
        if match and (previous is None or not (match.group(1) or ENDS_WITH_IN.search(previous))):
            return offset
        if code_line.strip():
            previous = code_line
        offset += len(line) + 1
    return None


def _is_prose(line: str) -> bool:
    """A sentence such as "Here is the solution:" (a line of code like `Some (f x)` is not one)."""
    return bool(PROSE.match(line)) and (line[-1] in ":.!" or bool(ENGLISH.search(line)))


def _drop_repeated_types(code: str, type_names: frozenset[str]) -> str:
    """Remove top-level type and exception definitions that only restate the problem's (the problem's are
    kept)."""
    starts = [m.start() for m in TOP_LEVEL.finditer(code)]
    if not starts:
        return code
    kept = [code[: starts[0]]]
    for start, end in zip(starts, [*starts[1:], len(code)], strict=True):
        chunk = code[start:end]
        names = set(TYPE_NAME.findall(chunk) + EXCEPTION_NAME.findall(chunk))
        if not (chunk.startswith(("type", "exception")) and names and names <= type_names):
            kept.append(chunk)
    return "".join(kept)


def assemble_solution(problem: Problem, completion_code: str) -> str:
    """The solution with the signature exactly once: body-only completions get the problem's signature,
    full definitions keep their own. `let rec` either way, so recursive bodies work whichever the prompt
    said."""
    code = _drop_repeated_types(completion_code, problem.type_names)
    start = own_definition(code, problem.function)
    if start is not None:
        # A definition with parameters may always be `let rec`; `let rec f = g` would not compile.
        definition = re.sub(
            rf"\A([ \t]*)let\s+(?!rec\b)({re.escape(problem.function)}\b)(?!\s*=)",
            r"\1let rec \2",
            code[start:],
            count=1,
        )
        return code[:start] + definition
    signature = re.sub(r"^let\s+(?!rec\b)", "let rec ", problem.signature, count=1)
    return f"{signature}\n{code}"


def reference_program(problem: Problem, solution: str) -> str:
    """A row's reference solution as the program the reward would build of it (the problem check's input)."""
    return assemble_solution(problem, extract_code(solution, problem.function))


def strip_comments(code: str) -> str:
    """OCaml source without its (nested) comments; string literals are kept intact."""
    if "(*" not in code:
        return code
    out: list[str] = []
    depth = 0
    i = 0
    in_string = False
    while i < len(code):
        c = code[i]
        if in_string:
            out.append(c)
            if c == "\\":
                out.append(code[i + 1 : i + 2])
                i += 1
            elif c == '"':
                in_string = False
        elif code.startswith("(*", i):
            depth += 1
            i += 1
        elif depth and code.startswith("*)", i):
            depth -= 1
            i += 1
        elif depth:
            if c == "\n":
                out.append(c)
        elif c == '"':
            in_string = True
            out.append(c)
        else:
            out.append(c)
        i += 1
    return "".join(out)


def code_lines(solution: str) -> int:
    """Non-empty lines once comments are removed: the line gate's measure."""
    return sum(1 for line in strip_comments(solution).split("\n") if line.strip())


# --- grading ------------------------------------------------------------------------------------------


def stage_of(outcome: Outcome) -> str:
    if outcome.ended.startswith(("compile timeout", "internal error")):
        return "timeout" if outcome.ended == "compile timeout" else "compile_error"
    if outcome.syntax_errors:
        return "syntax_error"
    if outcome.type_errors:
        return "type_error"
    if not outcome.compiled:
        return "compile_error"
    if outcome.ended == "timeout":
        return "timeout"
    if outcome.tests_total and outcome.tests_passed == outcome.tests_total:
        return "passed"
    raised = any(v.startswith("exn") for v in outcome.verdicts.values())
    if raised or len(outcome.verdicts) < outcome.tests_total:
        return "runtime_error"
    return "tests_failed"


def reason_of(stage: str, outcome: Outcome, syntax_credit: bool = False) -> str:
    passed = f"{outcome.tests_passed} of {outcome.tests_total} tests passed"
    edits = outcome.syntax_repairs if syntax_credit else 0  # the count is in the breakdown either way
    return {
        "syntax_error": f"syntax error ({edits} edit{'s' if edits > 1 else ''} from parsing)"
        if edits
        else "syntax error",
        "type_error": f"{outcome.type_errors} type error{'s' if outcome.type_errors > 1 else ''}",
        "compile_error": "the solution does not compile with the tests",
        "timeout": "compiler timed out" if not outcome.compiled else f"tests timed out; {passed}",
        "runtime_error": f"{passed}; the program raised or stopped early ({outcome.ended})",
        "tests_failed": passed,
        "passed": passed,
    }[stage]


def grade(
    outcome: Outcome,
    weights: tuple[float, float, float, float],
    structural_ok: bool,
    syntax_credit: bool = False,
) -> dict:
    """Stage scores from the toolchain's outcome (see docs/reward.md for the formula)."""
    w_structural, w_type, w_compile, w_tests = weights
    stage = stage_of(outcome)
    type_check = compile_score = tests = 0.0
    if outcome.type_errors:
        type_check = w_type * 0.5 / outcome.type_errors
        compile_score = w_compile * 0.5 * outcome.definitions_ok / max(outcome.definitions, 1)
    elif outcome.compiled:
        type_check, compile_score = w_type, w_compile
        tests = w_tests * outcome.tests_passed / outcome.tests_total if outcome.tests_total else 0.0
    elif stage == "compile_error" and outcome.definitions:
        # The solution types on its own but not with the tests (wrong signature, missing function).
        type_check, compile_score = w_type, w_compile * 0.5
    elif syntax_credit and stage == "syntax_error" and outcome.syntax_repairs:
        # REWARD_SYNTAX_CREDIT: below what the repaired text earns for typing, so breaking one never pays.
        type_check = w_type * 0.25 / (outcome.syntax_repairs * max(outcome.repaired_type_errors, 1))
    # else: any other syntax error, a compiler timeout or crash earn nothing here.
    return {
        "structural": w_structural if structural_ok else 0.0,
        "type_check": type_check,
        "compile": compile_score,
        "tests": tests,
        "tests_passed": outcome.tests_passed,
        "tests_total": outcome.tests_total,
        "syntax_errors": outcome.syntax_errors,
        "syntax_repairs": outcome.syntax_repairs,
        "type_errors": outcome.type_errors,
        "stage": stage,
        "reason": reason_of(stage, outcome, syntax_credit),
        # Where it went wrong, in the answer's own file or the tests', never the sandbox's folders.
        "error_sample": outcome.error_sample or (first_failure(outcome) if outcome.compiled else ""),
    }


@dataclass
class Prepared:
    """A completion made ready for the toolchain, or the breakdown that says why it is not scored."""

    text: str
    structural_ok: bool
    truncated: bool
    job: Job | None
    early: dict | None  # a final breakdown when no compilation is needed
    short: str | None = None  # why the line gate zeroes it unless every test passes


def prepare(
    problem: str | None, tests: str | None, completion: Any, truncated: bool, cfg: RewardConfig
) -> Prepared:
    text = completion_text(completion)
    structural_ok = ends_with_marker(text)
    try:
        if not problem or not tests:
            raise ValueError("the row has no problem text or no tests")
        parsed = parse_problem(problem)
    except ValueError as exc:
        return Prepared(text, structural_ok, truncated, None, _unscored(str(exc)))
    solution = assemble_solution(parsed, extract_code(text, parsed.function))
    lines = code_lines(solution)
    # A short answer is compiled too: the gate stops partial credit for stubs, and a right answer is right.
    short = None
    if lines < cfg.min_non_empty_lines:
        short = f"{lines} code lines, fewer than MIN_NON_EMPTY_LINES={cfg.min_non_empty_lines}"
    job = Job(parsed.types, solution, tests, parsed.function)
    return Prepared(text, structural_ok, truncated, job, None, short)


def _unscored(reason: str) -> dict:
    return {
        "structural": 0.0,
        "type_check": 0.0,
        "compile": 0.0,
        "tests": 0.0,
        "tests_passed": 0,
        "tests_total": 0,
        "syntax_errors": 0,
        "syntax_repairs": 0,
        "type_errors": 0,
        "stage": "gated",
        "reason": reason,
        "error_sample": "",
    }


def _counts(breakdown: dict) -> dict:
    """What the toolchain found, kept in a gated breakdown: only the reward is withheld."""
    keys = ("tests_passed", "tests_total", "syntax_errors", "syntax_repairs", "type_errors", "error_sample")
    return {key: breakdown[key] for key in keys}


def finish(
    item: Prepared, outcome: Outcome | None, weights, cfg: RewardConfig, problem_id: Any = None
) -> dict:
    """The full breakdown: stage scores, the total in [0, 1], the runaway penalty."""
    breakdown = (
        item.early
        if outcome is None
        else grade(outcome, weights, item.structural_ok, cfg.reward_syntax_credit)
    )
    if item.short and breakdown["stage"] != "passed":
        breakdown = {**_unscored(f"{item.short}; {breakdown['reason']}"), **_counts(breakdown)}
    total = breakdown["structural"] + breakdown["type_check"] + breakdown["compile"] + breakdown["tests"]
    if breakdown["stage"] == "gated":
        total = 0.0
    runaway = item.truncated and END_MARKER not in item.text
    if runaway:
        total *= cfg.runaway_penalty_multiplier
    return {
        "problem_id": problem_id,
        "total_reward": round(min(max(total, 0.0), 1.0), 6),
        **breakdown,
        "runaway_penalty_applied": runaway,
        "preview": item.text[:PREVIEW_CHARS],
    }


# --- the pools behind the synchronous helpers ----------------------------------------------------------

_pools: dict[tuple, SandboxPool] = {}
_pools_lock = threading.Lock()


def shared_pool(cfg: RewardConfig) -> SandboxPool:
    """One pool per sandbox setting for the process, for callers that do not own one."""
    key = (cfg.ocaml_sandbox, cfg.reward_workers, cfg.limits())
    with _pools_lock:
        if key not in _pools:
            _pools[key] = SandboxPool(cfg.reward_workers, cfg.ocaml_sandbox, cfg.limits())
        return _pools[key]


@atexit.register
def close_shared_pools() -> None:
    """Stop the shared pools' workers (at exit, and after each test); the next shared_pool starts anew."""
    with _pools_lock:
        while _pools:
            _pools.popitem()[1].close()


def score_batch(
    items: list[dict], cfg: RewardConfig | None = None, epoch: float = 0.0, pool: SandboxPool | None = None
) -> list[dict]:
    """Breakdowns for many completions at once. Each item: problem, tests, completion, optional
    truncated and problem_id. Without `pool`, a process-wide one for cfg's sandbox settings."""
    cfg = cfg or envflags.from_env(RewardConfig)
    weights = cfg.weights_at(epoch)
    prepared = [
        prepare(it.get("problem"), it.get("tests"), it.get("completion"), bool(it.get("truncated")), cfg)
        for it in items
    ]
    if pool is None and any(p.job for p in prepared):
        pool = shared_pool(cfg)
    futures = [pool.submit(p.job) if pool and p.job else None for p in prepared]
    return [
        finish(p, f.result() if f else None, weights, cfg, it.get("problem_id"))
        for p, f, it in zip(prepared, futures, items, strict=True)
    ]


def score_completion(
    problem: str, tests: str, completion: str, *, truncated: bool = False, cfg: RewardConfig | None = None
) -> dict:
    """The breakdown of one completion (synchronous)."""
    item = {"problem": problem, "tests": tests, "completion": completion, "truncated": truncated}
    return score_batch([item], cfg)[0]


def solved_share(problems: list, stages: list[str]) -> float:
    """The share of groups (a problem's consecutive completions, as TRL orders them) that all pass every test:
    their rewards tie, so they count in frac_zero_std, but because the problem is solved, not stuck."""
    groups = [
        list(group) for _, group in itertools.groupby(zip(problems, stages, strict=True), key=lambda x: x[0])
    ]
    return sum(all(stage == "passed" for _, stage in group) for group in groups) / len(groups)


def completion_message(breakdown: dict) -> str:
    """What the toolchain said about one completion, in one line: the reason, then the compiler's or the
    tests' first error where there is one."""
    sample = " ".join(str(breakdown.get("error_sample") or "").split())
    return f"{breakdown['reason']}: {sample}" if sample else breakdown["reason"]


# --- the TRL reward function ------------------------------------------------------------------------------


class SyntaxAwareReward:
    """GRPOTrainer reward function: `reward_funcs=[SyntaxAwareReward(cfg, log_dir, max_len)]`."""

    __name__ = "syntax_aware_reward"

    def __init__(
        self,
        cfg: RewardConfig,
        log_dir: Path | None = None,
        max_completion_length: int | None = None,
        *,
        completion_columns: bool = False,
    ):
        self.cfg = cfg
        self.max_completion_length = max_completion_length
        # problem_id, stage and message added to TRL's completion log, for the dashboard's table only.
        self.completion_columns = completion_columns
        self.pool = SandboxPool(cfg.reward_workers, cfg.ocaml_sandbox, cfg.limits())
        self.logs: dict[str, int] = {}
        # While held (dynamic sampling), a call's lines wait, in completion order, for write_held's marks.
        self.held: list[list[tuple[str, dict]]] | None = None
        if log_dir is not None:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            for name in ("completions.jsonl", "syntax_aware_breakdown.jsonl"):
                # O_APPEND and one os.write per line: concurrent writers never interleave, nothing buffered.
                self.logs[name] = os.open(Path(log_dir) / name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    async def __call__(
        self,
        prompts: list,
        completions: list,
        completion_ids: list | None = None,
        trainer_state: Any = None,
        problem: list[str] | None = None,
        tests: list[str] | None = None,
        problem_id: list | None = None,
        **kwargs: Any,
    ) -> list[float]:
        n = len(completions)
        epoch = float(getattr(trainer_state, "epoch", None) or 0.0)
        weights = self.cfg.weights_at(epoch)
        problems = problem or [None] * n
        tests_list = tests or [None] * n
        ids = problem_id or kwargs.get("id") or [None] * n
        lengths = [len(c) if c is not None else None for c in (completion_ids or [None] * n)]
        first = 0
        if self.held is not None:
            first = len(self.held)
            self.held.extend([] for _ in range(n))

        async def score(i: int) -> dict:
            truncated = (
                self.max_completion_length is not None and (lengths[i] or 0) >= self.max_completion_length
            )
            item = prepare(problems[i], tests_list[i], completions[i], truncated, self.cfg)
            outcome = await asyncio.wrap_future(self.pool.submit(item.job)) if item.job else None
            breakdown = finish(item, outcome, weights, self.cfg, ids[i])
            self._log(breakdown, item, lengths[i], first + i)
            return breakdown

        breakdowns = await asyncio.gather(*(score(i) for i in range(n)))
        log_metric = kwargs.get("log_metric")
        if log_metric is not None and n:
            counts = Counter(b["stage"] for b in breakdowns)
            for stage in STAGES:
                log_metric(f"stages/{stage}", counts[stage] / n)
            log_metric("groups/solved", solved_share(problems, [b["stage"] for b in breakdowns]))
        log_extra = kwargs.get("log_extra")
        if self.completion_columns and log_extra is not None:
            log_extra("problem_id", [str(b["problem_id"]) for b in breakdowns])
            log_extra("stage", [b["stage"] for b in breakdowns])
            log_extra("message", [completion_message(b) for b in breakdowns])
        return [b["total_reward"] for b in breakdowns]

    def _log(self, breakdown: dict, item: Prepared, length: int | None, index: int = 0) -> None:
        if not self.logs:
            return
        completion = {
            "problem_id": breakdown["problem_id"],
            "reward": breakdown["total_reward"],
            "length": length if length is not None else len(item.text),
            "runaway_penalty_applied": breakdown["runaway_penalty_applied"],
            "completion": item.text,
        }
        for name, record in (("completions.jsonl", completion), ("syntax_aware_breakdown.jsonl", breakdown)):
            if self.held is not None:
                self.held[index].append((name, record))
            else:
                os.write(self.logs[name], (json.dumps(record, default=str) + "\n").encode())

    def hold_logs(self) -> None:
        """Keep the log lines of the next calls until write_held: dynamic sampling marks each completion
        kept or dropped once its step's groups are chosen."""
        self.held = []

    def write_held(self, marks: list[dict]) -> None:
        """Write the held lines, in call and completion order, each with its completion's mark added."""
        held, self.held = self.held or [], None
        for lines, mark in zip(held, marks, strict=True):
            for name, record in lines:
                os.write(self.logs[name], (json.dumps({**record, **mark}, default=str) + "\n").encode())

    def close(self) -> None:
        self.pool.close()
        for fd in self.logs.values():
            os.close(fd)
        self.logs = {}


# --- the scoring CLI ---------------------------------------------------------------------------------------


def problems_by_id(path: Path) -> dict[str, tuple[str, str]]:
    """{id: (prompt, tests)} of a problems file; a malformed row is named on stderr and left out, so the
    completions of that problem score 0 and the others are scored."""
    warn = lambda text: print(f"{path}: {text}", file=sys.stderr)
    return {p["id"]: (p["problem"], p["tests"]) for p in usable_problems(load_rows(path), warn, need_id=True)}


def score_files(problems_path: Path, completions_path: Path, cfg: RewardConfig) -> list[dict]:
    problems = problems_by_id(problems_path)
    if cfg.repair_problems:  # MultiPL-E's rendering bugs, each repair named on stderr
        rows = [{"id": id_, "problem": problem, "tests": tests} for id_, (problem, tests) in problems.items()]
        repaired, _ = repair_problems(rows, lambda text: print(text, file=sys.stderr))
        problems = {row["id"]: (row["problem"], row["tests"]) for row in repaired}
    items = []
    for row in load_rows(completions_path):
        problem, tests = problems.get(str(row.get("problem_id")), (None, None))
        items.append({**row, "problem": problem, "tests": tests, "completion": row.get("completion") or ""})
    return score_batch(items, cfg)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Score completions with the syntax-aware reward.")
    commands = parser.add_subparsers(dest="command", required=True)
    score = commands.add_parser("score", help="print one JSON breakdown per completion, in order")
    score.add_argument(
        "problems", type=Path, help="JSONL, CSV or parquet with id, prompt (or problem), tests"
    )
    score.add_argument("completions", type=Path, help="JSONL with problem_id, completion, optional truncated")
    envflags.add_arguments(score, RewardConfig)
    check = commands.add_parser("check", help="name each problem whose tests or reference solution fail")
    check.add_argument("problems", help="a problems file, or a dataset id (ID:CONFIG[:SPLIT] for MultiPL-E)")
    envflags.add_arguments(check, RewardConfig)
    args = parser.parse_args(argv)
    try:
        cfg, _ = envflags.resolve(RewardConfig, args)
    except ConfigError as exc:
        parser.error(str(exc))
    if args.command == "check":
        try:
            return check_source(args.problems, cfg, reference_program)
        except (ConfigError, OSError) as exc:
            parser.error(str(exc))
    try:
        breakdowns = score_files(args.problems, args.completions, cfg)
    except OSError as exc:
        parser.error(f"{exc.filename}: {exc.strerror}")
    for breakdown in breakdowns:
        shown = {"problem_id": breakdown["problem_id"], "total": breakdown["total_reward"]}
        shown.update((k, v) for k, v in breakdown.items() if k not in ("problem_id", "total_reward"))
        print(json.dumps(shown), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
