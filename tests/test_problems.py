"""Checks for the bundled problem sets, data/problems.jsonl (training) and data/heldout.jsonl (evaluation):
schema, every problem against the real OCaml compiler, and a held-out set sharing nothing with training."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
TRAINING, HELDOUT = "problems.jsonl", "heldout.jsonl"
FIELDS = ("id", "prompt", "tests", "solution", "difficulty")
DIFFICULTIES = {"easy", "medium", "hard"}
SIGNATURE_RE = re.compile(r"^let (?:rec )?(?P<name>[a-z_][A-Za-z0-9_']*)(?: \([a-z_][\w']* : .+?\))+ : .+ =$")
STUB_BODY = ' failwith "todo"'
RUN_TIMEOUT_S = 10

# One plausible wrong answer per held-out problem, as (text of the reference solution, replacement): the
# tests must reject it, so an answer that is close but wrong cannot pass.
HELDOUT_MUTANTS: dict[str, tuple[str, str]] = {
    "alternating_sum": ("go (-sign)", "go sign"),
    "nth_or_default": ("if i = 0 then x", "if i = 1 then x"),
    "hamming_distance": ("if n <> String.length b", "if n > String.length b"),
    "is_non_decreasing": ("a <= b", "a < b"),
    "dedup_adjacent": ("| y :: _ when y = x ->", "| _ when List.mem x acc ->"),
    "sum_somes": ("| None -> acc", "| None -> 0"),
    "is_leap_year": (" || year mod 400 = 0", ""),
    "manhattan_distance": ("abs (p.x - q.x) + abs (p.y - q.y)", "abs (p.x - q.x + (p.y - q.y))"),
    "coins_value": ("| Nickel -> 5\n    | Dime -> 10", "| Nickel -> 10\n    | Dime -> 5"),
    "index_of_max": ("a.(i) > a.(!best)", "a.(i) >= a.(!best)"),
    "remove_char": ("if ch <> c", "if Char.lowercase_ascii ch <> Char.lowercase_ascii c"),
    "is_all_digits": ('s <> "" && ', ""),
    "is_power_of_two": ("n > 0 && halves n", "n land (n - 1) = 0"),
    "count_divisors": ("for d = 1 to n do", "for d = 1 to n / 2 do"),
    "zip_shortest": ("| _ -> List.rev acc", "| _ -> acc"),
    "count_leaves": ("| Empty -> 0", "| Empty -> 1"),
    "interleave": ("go (y :: x :: acc)", "go (x :: y :: acc)"),
    "group_by_length": ("(n, List.rev ws)", "(n, ws)"),
    "parse_key_values": ("String.index_opt item", "String.rindex_opt item"),
    "apply_edits": ("List.sort compare (", "List.rev ("),
    "longest_rising_run": ("if x > prev", "if x >= prev"),
    "binary_search": ("if lo > hi", "if lo >= hi"),
    "is_anagram": ("List.sort compare !acc", "List.sort_uniq compare !acc"),
    "camel_to_snake": ("if i > 0 then Buffer.add_char buf '_';", "Buffer.add_char buf '_';"),
    "valid_ipv4": ("&& (n = 1 || p.[0] <> '0')", ""),
    "divide_pairs": ("go 0 [] pairs", "go 1 [] pairs"),
    "first_repeat": ("go xs", "go (List.rev xs)"),
    "pair_with_sum": ("search 0 1", "search 0 0"),
    "root_to_leaf_paths": ("| Empty -> acc", "| Empty -> List.rev path :: acc"),
    "overdrawn_accounts": ("if now < 0 &&", "if t.amount < 0 &&"),
    "mat_mul": ("a.(i).(k) * b.(k).(j)", "a.(k).(i) * b.(k).(j)"),
    "count_islands": (
        "flood r (c - 1)",
        "flood r (c - 1);\n      flood (r + 1) (c + 1);\n      flood (r + 1) (c - 1)",
    ),
    "distinct_in_order": ("if List.mem x seen", "if List.mem x rest"),
    "column_label": ("go ((n - 1) / 26)", "go (n / 26)"),
    "squeeze_spaces": ("String.split_on_char ' ' s", "String.split_on_char ' ' (String.trim s)"),
    "min_path_sum": ("min best.(r - 1).(c) best.(r).(c - 1)", "best.(r - 1).(c)"),
    "edit_distance": ("(prev.(j - 1) + cost)", "(prev.(j - 1) + (2 * cost))"),
    "topo_order": ("Some (List.rev order)", "Some order"),
    "shortest_distances": ("| Some db when db <= du + w -> ()", "| Some _ -> ()"),
    "connected_components": ("adjacent.(b) <- a :: adjacent.(b)", "ignore a"),
    "number_in_words": ('^ "-" ^', '^ " " ^'),
    "split_csv_line": ("if i < n && s.[i] = '\"' then quoted (i + 1) else plain i", "plain i"),
    "longest_increasing_subseq": ("a.(j) < a.(i)", "a.(j) <= a.(i)"),
    "best_pack_value": ("for c = cap downto w do", "for c = w to cap do"),
    "is_tautology": (" && always ((x, false) :: env) rest", ""),
    "best_path_sum": ("v + gain down_l + gain down_r", "v + max (gain down_l) (gain down_r)"),
    "expand_braces": (
        "List.concat_map (fun p -> List.map (fun o -> p ^ o) options) prefixes",
        "List.concat_map (fun o -> List.map (fun p -> p ^ o) prefixes) options",
    ),
    "can_segment": ("k > 0 && k <= i && reachable.(i - k)", "k > 0 && k <= i"),
}


def load_problems(name: str) -> list[dict[str, str]]:
    with (DATA_DIR / name).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


PROBLEM_SETS = {name: load_problems(name) for name in (TRAINING, HELDOUT)}
ALL_PROBLEMS = [
    pytest.param(p, id=f"{name.removesuffix('.jsonl')}-{p['id']}")
    for name, problems in PROBLEM_SETS.items()
    for p in problems
]
HELDOUT_BY_ID = {p["id"]: p for p in PROBLEM_SETS[HELDOUT]}


def signature_name(problem: dict[str, str]) -> str | None:
    """The function's name from the prompt's last non-empty line, or None when that line is no signature."""
    last_line = [line for line in problem["prompt"].splitlines() if line.strip()][-1]
    signature = SIGNATURE_RE.match(last_line)
    return signature["name"] if signature else None


def compile_and_run(prompt: str, body: str, tests: str, workdir: Path) -> tuple[bool, int, str]:
    """Compile `<prompt><body>\\n\\n<tests>` with ocamlc and run it.

    Returns (compiled, exit code of the program or -1, combined output).
    """
    source = workdir / "prog.ml"
    source.write_text(prompt + body + "\n\n" + tests, encoding="utf-8")
    build = subprocess.run(
        ["ocamlc", "-o", "prog", "prog.ml"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if build.returncode != 0:
        return False, -1, build.stdout + build.stderr
    run = subprocess.run(
        [str(workdir / "prog")],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    return True, run.returncode, run.stdout + run.stderr


@pytest.mark.parametrize("name", PROBLEM_SETS)
def test_problem_set_shape(name: str) -> None:
    problems = PROBLEM_SETS[name]
    assert len(problems) >= 40
    ids = [p["id"] for p in problems]
    assert len(ids) == len(set(ids)), "duplicate ids"
    for p in problems:
        for field in FIELDS:
            assert isinstance(p.get(field), str) and p[field], f"{p.get('id')}: bad field {field}"
        assert p["difficulty"] in DIFFICULTIES, p["id"]
        function = signature_name(p)
        assert function, f"{p['id']}: prompt does not end in a signature"
        tests = p["tests"].strip()
        assert tests.startswith("let () =") and tests.endswith(";;"), p["id"]
        asserts = [line for line in tests.splitlines() if line.strip().startswith("assert (")]
        assert len(asserts) >= 4, f"{p['id']}: only {len(asserts)} asserts"
        assert function in asserts[0], f"{p['id']}: the first assert does not call the function"
    assert {p["difficulty"] for p in problems} == DIFFICULTIES, "some difficulty has no problem"


def test_heldout_disjoint_from_training() -> None:
    training, heldout = PROBLEM_SETS[TRAINING], PROBLEM_SETS[HELDOUT]
    shared_ids = {p["id"] for p in training} & {p["id"] for p in heldout}
    assert not shared_ids, f"ids in both sets: {sorted(shared_ids)}"
    training_text = (DATA_DIR / TRAINING).read_text(encoding="utf-8")
    for p in heldout:
        name = signature_name(p)
        assert name and not re.search(rf"\b{re.escape(name)}\b", training_text), (
            f"{p['id']}: function name {name!r} appears in {TRAINING}"
        )
    shared_prompts = {p["prompt"] for p in training} & {p["prompt"] for p in heldout}
    assert not shared_prompts, "a prompt appears in both sets"


@pytest.mark.parametrize("problem", ALL_PROBLEMS)
def test_reference_solution_passes(problem: dict[str, str], tmp_path: Path) -> None:
    prompt, solution, tests = problem["prompt"], problem["solution"], problem["tests"]
    compiled, code, output = compile_and_run(prompt, solution, tests, tmp_path)
    assert compiled, f"reference solution does not compile:\n{output}"
    assert code == 0, f"reference solution fails its tests (exit {code}):\n{output}"
    assert output == "", f"program printed output:\n{output}"


@pytest.mark.parametrize("problem", ALL_PROBLEMS)
def test_stub_fails(problem: dict[str, str], tmp_path: Path) -> None:
    compiled, code, output = compile_and_run(problem["prompt"], STUB_BODY, problem["tests"], tmp_path)
    assert compiled, f"stub program does not compile:\n{output}"
    assert code != 0, "tests pass with a stub body that always raises"
    assert "todo" in output, f"first failure is not the stub being called:\n{output}"


def test_every_heldout_problem_has_a_mutant() -> None:
    assert set(HELDOUT_MUTANTS) == set(HELDOUT_BY_ID)


@pytest.mark.parametrize("problem_id", HELDOUT_MUTANTS)
def test_plausible_wrong_answer_fails(problem_id: str, tmp_path: Path) -> None:
    problem = HELDOUT_BY_ID[problem_id]
    old, new = HELDOUT_MUTANTS[problem_id]
    assert problem["solution"].count(old) == 1, f"the mutated text {old!r} is not once in the solution"
    wrong = problem["solution"].replace(old, new)
    compiled, code, output = compile_and_run(problem["prompt"], wrong, problem["tests"], tmp_path)
    assert compiled, f"wrong answer does not compile:\n{output}"
    assert code != 0, "the tests accept a wrong answer"
    assert "Assert_failure" in output, f"the wrong answer fails by an exception, not an assert:\n{output}"


# data/demo_heldout.jsonl: the demo's generalisation check, a dozen unseen problems of the demo's own kinds
# (the skills of data/demo_problems.jsonl, new names, constants and wording). Each with a plausible wrong
# answer, in the style of data/demo_sft.jsonl's, that its tests must reject.
DEMO_HELDOUT, DEMO_TRAINING = "demo_heldout.jsonl", ("demo_problems.jsonl", "demo_sft.jsonl")
DEMO_HELDOUT_MUTANTS: dict[str, tuple[str, str]] = {
    "plus_two": ("k + 2", "k - 2"),
    "square_area": ("side * side", "side + side"),
    "is_odd": ("m mod 2 <> 0", "m mod 2 = 0"),
    "smaller": ("if x < y", "if x > y"),
    "count_words": ("List.length words", "List.length words - 1"),
    "product": ("List.fold_left ( * ) 1 ys", "List.fold_left ( + ) 0 ys"),
    "flip": ("List.rev ws", "ws"),
    "whisper": ("String.lowercase_ascii s", "String.uppercase_ascii s"),
    "tripled": ("fun x -> 3 * x", "fun x -> x + 3"),
    "gap": ("abs (x - y)", "x - y"),
    "farewell": ('"Goodbye, " ^ who ^ "."', '"Goodbye " ^ who'),
    "negatives": ("x < 0", "x > 0"),
}
DEMO_HELDOUT_BY_ID = {p["id"]: p for p in load_problems(DEMO_HELDOUT)}


def test_demo_heldout_is_a_dozen_unseen_problems_of_the_demos_kinds() -> None:
    problems = list(DEMO_HELDOUT_BY_ID.values())
    assert len(problems) == 12 and set(DEMO_HELDOUT_MUTANTS) == set(DEMO_HELDOUT_BY_ID)
    demo_rows = [row for name in DEMO_TRAINING for row in load_problems(name)]
    demo_names = {signature_name(row) for row in demo_rows}
    for p in problems:
        assert all(isinstance(p.get(field), str) and p[field] for field in FIELDS), p.get("id")
        assert p["difficulty"] == "easy" and signature_name(p) not in demo_names, p["id"]
        asserts = [line for line in p["tests"].splitlines() if line.strip().startswith("assert (")]
        assert len(asserts) >= 4 and signature_name(p) in asserts[0], p["id"]
    assert not {p["prompt"] for p in problems} & {row["prompt"] for row in demo_rows}


@pytest.mark.parametrize("problem_id", DEMO_HELDOUT_MUTANTS)
def test_demo_heldout_reference_passes_and_plausible_wrong_answer_fails(
    problem_id: str, tmp_path: Path
) -> None:
    problem = DEMO_HELDOUT_BY_ID[problem_id]
    compiled, code, output = compile_and_run(
        problem["prompt"], problem["solution"], problem["tests"], tmp_path
    )
    assert compiled and code == 0 and output == "", f"the reference solution fails:\n{output}"
    old, new = DEMO_HELDOUT_MUTANTS[problem_id]
    assert problem["solution"].count(old) == 1, f"the mutated text {old!r} is not once in the solution"
    wrong = problem["solution"].replace(old, new)
    compiled, code, output = compile_and_run(problem["prompt"], wrong, problem["tests"], tmp_path)
    assert compiled, f"wrong answer does not compile:\n{output}"
    assert code != 0 and "Assert_failure" in output, f"the tests accept a wrong answer:\n{output}"
