"""MultiPL-E as a source, on fixtures written here in its layout (tests/fixtures/multipl_e_humaneval_ml.jsonl:
`name`, `prompt`, `tests`, `stop_tokens`, ...): its rows load, its rendering bugs are found and repaired only
when asked, a short correct answer counts as a pass, and its own sampling protocol runs on a real model."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

import evaluate
import multipl_e
from problem_check import check_problems
from rewards import RewardConfig, reference_program, score_batch

FIXTURES = Path(__file__).resolve().parent / "fixtures"
HUMANEVAL = FIXTURES / "multipl_e_humaneval_ml.jsonl"
ANSWERS = FIXTURES / "multipl_e_answers.jsonl"
CFG = RewardConfig(reward_workers=2)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def fixture_problems() -> list[dict]:
    rows = [json.loads(line) for line in HUMANEVAL.read_text().splitlines()]
    return [{"id": r["name"], "problem": r["prompt"].strip(), "tests": r["tests"]} for r in rows]


def test_sources_carry_a_config_and_a_split(tmp_path):
    assert multipl_e.split_source("nuprl/MultiPL-E:humaneval-ml") == ("nuprl/MultiPL-E", "humaneval-ml", None)
    assert multipl_e.split_source("nuprl/MultiPL-E:mbpp-ml:test") == ("nuprl/MultiPL-E", "mbpp-ml", "test")
    assert multipl_e.split_source("kiranpg/ocaml-training-problems") == (
        "kiranpg/ocaml-training-problems",
        None,
        None,
    )
    local = tmp_path / "a:b"  # an existing path is a path, colon or not
    local.write_text("")
    assert multipl_e.split_source(str(local)) == (str(local), None, None)

    assert multipl_e.choose_split(["test"], None, "x") == "test"
    assert multipl_e.choose_split(["test", "train"], None, "x") == "train"
    assert multipl_e.choose_split(["test", "train"], "test", "x") == "test"
    with pytest.raises(ValueError, match="several splits \\(test, validation\\)"):
        multipl_e.choose_split(["test", "validation"], None, "x")
    with pytest.raises(ValueError, match="no split 'train' \\(it has test\\)"):
        multipl_e.choose_split(["test"], "train", "x")


def test_repairs_touch_code_only_and_are_counted():
    tests = (
        'let () =\n  assert (f [(~4); .5] (~3).0 = "(~1) .5");\n'
        "  (* (~2) .5 *)\n  assert (g '~' x.(1) 1.5 = (~7))\n"
    )
    repaired, counts = multipl_e.repair_tests(tests)
    assert repaired == (
        'let () =\n  assert (f [(-4); 0.5] (-3.0) = "(~1) .5");\n'
        "  (* (~2) .5 *)\n  assert (g '~' x.(1) 1.5 = (-7))\n"
    )
    assert counts == {"negative literal `(~N)`": 3, "float `.N`": 1}
    assert multipl_e.describe(counts) == "3 negative literals `(~N)`, 1 float `.N`"
    assert multipl_e.repair_tests(repaired) == (repaired, {})


def test_rendering_bugs_break_problems_until_repaired():
    problems = fixture_problems()
    broken = dict(check_problems(problems, CFG, reference_program).broken)
    assert sorted(broken) == ["HumanEval_1_count_below", "HumanEval_2_halve_all", "HumanEval_4_is_even"]
    assert "tests line 6: `(~4)`, a known MultiPL-E rendering bug" in broken["HumanEval_1_count_below"]
    assert "tests line 4: `.5`" in broken["HumanEval_2_halve_all"]
    assert "REPAIR_PROBLEMS" not in broken["HumanEval_4_is_even"]  # a real error, nothing to repair

    notes = []
    repaired, counts = multipl_e.repair_problems(problems, notes.append)
    assert counts == {"negative literal `(~N)`": 4, "float `.N`": 1}
    assert notes == [
        "repaired problem HumanEval_1_count_below: 3 negative literals `(~N)`",
        "repaired problem HumanEval_2_halve_all: 1 negative literal `(~N)`, 1 float `.N`",
        "REPAIR_PROBLEMS: 4 negative literals `(~N)`, 1 float `.N` repaired in 2 of 5 problems",
    ]
    # The string in HumanEval_3_shout's tests holds `(~1) .5`: left alone, so the problem stays as it was.
    assert repaired[3] == problems[3]
    assert [problem_id for problem_id, _ in check_problems(repaired, CFG, reference_program).broken] == [
        "HumanEval_4_is_even"
    ]


def test_right_answers_pass_and_wrong_ones_fail_once_repaired():
    problems = {p["id"]: p for p in multipl_e.repair_problems(fixture_problems(), lambda _: None)[0]}
    answers = [json.loads(line) for line in ANSWERS.read_text().splitlines()]
    items = [
        {**a, "problem": problems[a["problem_id"]]["problem"], "tests": problems[a["problem_id"]]["tests"]}
        for a in answers
        if a["problem_id"] != "HumanEval_4_is_even"
    ]
    ungated = RewardConfig(reward_workers=2, min_non_empty_lines=0)
    stages = [(a["kind"], s["stage"]) for a, s in zip(items, score_batch(items, ungated), strict=True)]
    assert stages == [("right", "passed"), ("wrong", "tests_failed")] * 4
    # Under the training default (MIN_NON_EMPTY_LINES=8) the one-line wrong answers are gated (reward 0) and
    # the right ones still pass.
    assert [s["stage"] for s in score_batch(items, CFG)] == ["passed", "gated"] * 4


# --- the rules for each kind of rendering fault, on small inputs written here -----------------------------

ASSERTIONS = "\nlet assertions =\n let candidate = {f} in\n{lines}  ()\n"


def assertions(function: str, *lines: str) -> str:
    """Tests in the translator's layout: `  (assert ((candidate ARGS) = EXPECTED));` per line."""
    return ASSERTIONS.format(f=function, lines="".join(f"  (assert ({line}));\n" for line in lines))


def repaired(prompt: str, tests: str) -> tuple[str, str, dict]:
    prompt, tests, fixes = multipl_e.repair_problem(prompt, tests)
    return prompt, tests, multipl_e.tally(Counter(fix.kind for fix in fixes))


def test_a_stray_quote_in_a_comment_is_deleted_only_where_the_text_does_not_lex():
    prompt = '(**"\nSum the list.\n>>> total [1; 2]\n3\n*)\nlet total (xs : int list) : int ='
    fixed, _, counts = repaired(prompt, "")
    assert fixed == prompt.replace('(**"', "(**", 1)
    assert counts == {multipl_e.QUOTE: 1}
    assert multipl_e.describe(counts) == '1 quote `"` in a comment'
    # In a comment's middle, with a second comment after it: only the lone quote goes.
    prompt = '(** The "best" one, 5" long. *)\n(* "ok" *)\nlet f (s : string) : string ='
    assert repaired(prompt, "")[0] == prompt.replace('5" long', "5 long")
    # Valid comments are left alone: balanced quotes, a quote character, a string holding `*)`.
    for valid in (
        '(** Return "Yes" or "No". *)\nlet f (s : string) : string =',
        "(** The character '\"' counts. *)\nlet f (s : string) : int =",
        '(* "*)" *)\nlet f (s : string) : string =',
    ):
        assert repaired(valid, "") == (valid, "", {})
    # A string in code is no comment: an unterminated one is not this rule's to mend.
    assert repaired("", 'let x = "abc (* " *)') == ("", 'let x = "abc (* " *)', {})


def test_a_capitalised_parameter_or_function_name_gets_a_lower_case_first_letter():
    prompt = (
        '(**Given a positive integer N, return its digits.\n>>> Solve_It 12\n"3"\n*)\n'
        "let Solve_It (N : int) (S : string) (n : int) : string ="
    )
    tests = assertions(
        "Solve_It", '(candidate 12 "N" 0) = "Solve_It"', "(List.map Fun.id [Some 1]) = [Some 1]"
    )
    prompt2, tests2, counts = repaired(prompt, tests)
    # `n` is taken, so N becomes `n_`; the doc comment, the strings, constructors and modules stay.
    assert prompt2.endswith("let solve_It (n_ : int) (s : string) (n : int) : string =")
    assert prompt2.startswith("(**Given a positive integer N, return its digits.\n>>> Solve_It 12")
    assert tests2 == tests.replace("candidate = Solve_It in", "candidate = solve_It in")
    assert counts == {multipl_e.CAPITAL: 3}
    assert "repairs it" in multipl_e.repair_hint(tests, prompt)
    # A constructor the prompt defines, or the stdlib's, may be a pattern: valid, so untouched.
    valid = "type t = A | B\n\n(** Doc. *)\nlet f (A : t) (None : int option) : int ="
    assert repaired(valid, assertions("f", "(candidate A None) = 1")) == (
        valid,
        assertions("f", "(candidate A None) = 1"),
        {},
    )


def test_a_pair_list_type_gets_a_star():
    prompt = (
        "(** Counts. *)\nlet histogram (test : string) (seen : (string, int) list) : (string, int) list ="
    )
    tests = assertions("histogram", '(candidate "a" []) = [("a", 1)]')
    fixed, same, counts = repaired(prompt, tests)
    assert fixed.endswith("(seen : (string * int) list) : (string * int) list =")
    assert (same, counts) == (tests, {multipl_e.PAIR_LIST: 2})
    # A two-parameter type is valid with a comma.
    valid = "(** Doc. *)\nlet f (t : (string, int) Hashtbl.t) : int ="
    assert repaired(valid, "") == (valid, "", {})


def test_a_tuple_list_type_follows_the_values_the_tests_hold():
    prompt = "(** Coordinates. *)\nlet get_row (lst : int list list) (x : int) :  int * int list ="
    tests = assertions("get_row", "(candidate [[1]; [2; 1]] 1) = [(0, 0); (1, 1)]", "(candidate [] 1) = []")
    fixed, _, counts = repaired(prompt, tests)
    assert fixed.endswith("(x : int) :  (int * int) list =")
    assert counts == {multipl_e.TUPLE_LIST: 1}
    # The same text is right where the values are pairs of an int and a list: untouched.
    split = assertions("get_row", "(candidate [[1]] 1) = (1, [2; 3])")
    assert repaired(prompt, split) == (prompt, split, {})
    # A parameter too, and an option of pairs (`Some(None)` is the translator's None).
    prompt = "(** Doc. *)\nlet f (pairs :  string * int list) :  int * int option ="
    tests = assertions("f", '(candidate [("a", 1)]) = Some((1, 2))', "(candidate []) = Some(None)")
    fixed, tests2, counts = repaired(prompt, tests)
    assert fixed.endswith("let f (pairs :  (string * int) list) :  (int * int) option =")
    assert "(candidate []) = None" in tests2
    assert counts == {multipl_e.TUPLE_LIST: 2, multipl_e.SOME_NONE: 1}
    # No evidence in the tests (an expression, not a value): nothing is guessed.
    unread = assertions("f", "(candidate (List.rev [])) = (fst (Some 1, 2))")
    assert repaired(prompt, unread)[2] == {}


def test_some_none_becomes_none_where_the_type_is_an_option():
    prompt = "(** Doc. *)\nlet f (xs : int list) :  int option * string option ="
    tests = assertions(
        "f", '(candidate [1]) = (Some(None), Some("Some(None)"))', "(candidate []) = (Some(None), Some(None))"
    )
    _, fixed, counts = repaired(prompt, tests)
    assert fixed == tests.replace('(Some(None), Some("', '(None, Some("').replace(
        "(Some(None), Some(None))", "(None, None)"
    )
    assert counts == {multipl_e.SOME_NONE: 3}
    assert multipl_e.describe(counts) == "3 None values `Some(None)`"
    # Valid where the type is an option of an option, or unknown (a type variable).
    for signature in ("let f (xs : int list) : int option option =", "let f (xs : 'a list) : 'a option ="):
        tests = assertions("f", "(candidate []) = Some(None)")
        assert repaired(signature, tests) == (signature, tests, {})


def test_repairs_are_counted_named_and_idempotent_across_prompt_and_tests():
    problems = [
        {
            "id": "cap",
            "problem": '(**"Doc.\n*)\nlet Strongest (N : int) : int option =',
            "tests": assertions("Strongest", "(candidate (~1)) = Some(None)", "(candidate .5) = Some(1)"),
        },
        {
            "id": "fine",
            "problem": "(** Doc. *)\nlet f (x : int) : int =",
            "tests": assertions("f", "(candidate 1) = 1"),
        },
    ]
    notes = []
    out, counts = multipl_e.repair_problems(problems, notes.append)
    assert counts[multipl_e.CAPITAL] == 2
    assert out[0]["problem"] == "(**Doc.\n*)\nlet strongest (n : int) : int option ="
    assert "candidate = strongest in" in out[0]["tests"] and "(candidate (-1)) = None" in out[0]["tests"]
    assert out[1] == problems[1]
    assert notes == [
        'repaired problem cap: 1 negative literal `(~N)`, 1 float `.N`, 1 quote `"` in a comment, '
        "2 capitalised names `N`, 1 None value `Some(None)`",
        'REPAIR_PROBLEMS: 1 negative literal `(~N)`, 1 float `.N`, 1 quote `"` in a comment, '
        "2 capitalised names `N`, 1 None value `Some(None)` repaired in 1 of 2 problems",
    ]
    assert multipl_e.repair_problems(out, notes.append) == (out, Counter())
    # Rows without a prompt (the scoring CLI's) get the rules that need none.
    tests_only, _ = multipl_e.repair_problems([{"id": "t", "tests": problems[0]["tests"]}], lambda _: None)
    assert "(candidate (-1)) = Some(None)" in tests_only[0]["tests"]


TRANSLATED = [  # each kind as MultiPL-E's translator renders it, with a right answer
    (
        "capital",
        "(**Doc.\n*)\nlet Strongest_Extension (class_name : string) (extensions : string list) : string =",
        assertions(
            "Strongest_Extension", '(candidate "K" ["Strongest_Extension"]) = "K.Strongest_Extension"'
        ),
        '  class_name ^ "." ^ List.hd extensions',
    ),
    (
        "pair",
        "(**Doc.\n*)\nlet histogram (test : string) : (string, int) list =",
        assertions("histogram", '(candidate "a") = [("a", 1)]', '(candidate "") = []'),
        '  if test = "" then [] else [(test, 1)]',
    ),
    (
        "tuple",
        "(**Doc.\n*)\nlet get_row (lst : int list list) (x : int) :  int * int list =",
        assertions("get_row", "(candidate [[1]] 1) = [(0, 0)]", "(candidate [] 1) = []"),
        "  if lst = [] then [] else [(0, 0)]",
    ),
    (
        "none",
        "(**Doc.\n*)\nlet smallest (lst : int list) :  int option * int option =",
        assertions(
            "smallest", "(candidate []) = (Some(None), Some(None))", "(candidate [2]) = (Some(2), Some(None))"
        ),
        "  match lst with [] -> (None, None) | x :: _ -> (Some x, None)",
    ),
    (
        "quote",
        '(**"Doc with a stray quote.\n*)\nlet pluck (arr : int list) : int list =',
        assertions("pluck", "(candidate [1]) = [1]"),
        "  arr",
    ),
]


def test_translated_faults_break_problems_until_repaired_and_right_answers_pass():
    problems = [
        {"id": name, "problem": prompt, "tests": tests, "solution": solution}
        for name, prompt, tests, solution in TRANSLATED
    ]
    broken = dict(check_problems(problems, CFG, reference_program).broken)
    assert list(broken) == [name for name, *_ in TRANSLATED]
    assert "(prompt line 3: `Strongest_Extension`, a known MultiPL-E rendering bug" in broken["capital"]
    assert "(prompt line 3: `(string, int) list`" in broken["pair"]
    assert "(prompt line 3: `int * int list`" in broken["tuple"]
    assert "(tests line 4: `Some(None)`" in broken["none"]
    assert '(prompt line 1: `"`' in broken["quote"]
    repaired_problems, _ = multipl_e.repair_problems(problems, lambda _: None)
    assert check_problems(repaired_problems, CFG, reference_program).broken == []


def test_tests_that_contradict_each_other_are_named_broken_for_that():
    from problem_check import contradiction

    prompt = "(** Doc. *)\nlet any_int (x : float) (y : float) : bool ="
    tests = assertions(
        "any_int", "(candidate 3.0 4.0) = true", "(candidate 1.0 4.) = false", "(candidate 3. 4.0) = false"
    )
    reason = contradiction(prompt, tests)
    assert reason is not None and reason.startswith(
        "the tests contradict each other: lines 4 and 6 expect `true` and `false` of the same call with "
        "`3. 4.0`, so no answer passes them all"
    )
    assert "not a rendering bug REPAIR_PROBLEMS repairs" in reason
    # One value spelled two ways is no contradiction, nor are calls whose arguments are not literals.
    same = assertions("any_int", "(candidate 3.0 (-1.0)) = true", "(candidate 3. (~-1.)) = true")
    assert contradiction(prompt, same) is None
    assert (
        contradiction(prompt, assertions("any_int", "(candidate x 1.0) = true", "(candidate x 1.0) = false"))
        is None
    )
    problems = [{"id": "contradiction", "problem": prompt, "tests": tests}]
    assert check_problems(problems, CFG, reference_program).broken == [("contradiction", reason)]


def test_a_capitalised_function_name_is_read_so_that_it_can_be_checked_and_repaired():
    from problems import parse_problem

    parsed = parse_problem("(** Doc. *)\nlet Strongest_Extension (class_name : string) : string =")
    assert parsed.function == "Strongest_Extension"


def test_stop_sequences_cut_the_continuation():
    stop = multipl_e.MULTIPL_E.stop
    assert multipl_e.stop_at_stop_sequence("  x + 1\n\nlet y = 2", stop) == ("  x + 1", True)
    assert multipl_e.stop_at_stop_sequence("  match x with\n  | _ -> 0\nlet z", stop) == (
        "  match x with\n  | _ -> 0",
        True,
    )
    assert multipl_e.stop_at_stop_sequence("  x", stop) == ("  x", False)


def test_protocol_samples_raw_continuations(tiny_model, one_torch_thread):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    protocol = multipl_e.Protocol(max_new_tokens=24)
    problems = fixture_problems()[:2]
    model.train()
    samples = evaluate.sample_continuations(
        model, tokenizer, problems, k=3, batch_size=4, seed=0, protocol=protocol
    )
    again = evaluate.sample_continuations(
        model, tokenizer, problems, k=3, batch_size=4, seed=0, protocol=protocol
    )
    assert samples == again  # the seed fixes the stream
    assert [(s["problem_id"], s["sample"]) for s in samples] == [
        (p["id"], i) for p in problems for i in range(3)
    ]
    for s in samples:
        assert not any(stop in s["completion"] for stop in protocol.stop)
        assert 0 < s["length"] <= 24
        assert not s["truncated"] or s["length"] == 24
    assert model.training  # put back as it was


def test_a_local_export_in_multipl_e_columns_loads_by_name(tmp_path):
    from problems import load_problems

    export = tmp_path / "humaneval-ml"  # as the hub has it: one config, a `test` split only
    export.mkdir()
    (export / "test.jsonl").write_text(HUMANEVAL.read_text())
    warnings = []
    problems = load_problems(str(export), warn=warnings.append)
    assert [p["id"] for p in problems] == [p["id"] for p in fixture_problems()]
    assert problems[0]["problem"].endswith("let larger (a : int) (b : int) : int =")
    assert warnings == []
    assert [p["id"] for p in load_problems(str(HUMANEVAL))] == [p["id"] for p in problems]


def test_a_short_correct_answer_passes_and_a_short_wrong_one_is_gated():
    from eval_stats import summarize
    from evaluate import score_samples

    problems = [{**p, "difficulty": "unknown"} for p in fixture_problems()[:1]]
    samples = [
        {
            "problem_id": "HumanEval_0_larger",
            "sample": 0,
            "completion": "  if a > b then a else b",
            "truncated": False,
        },
        {"problem_id": "HumanEval_0_larger", "sample": 1, "completion": "  a", "truncated": False},
    ]
    rows = score_samples([{**s, "length": 9} for s in samples], problems, CFG)  # MIN_NON_EMPTY_LINES=8
    assert [(r["passed"], r["stage"], r["total_reward"]) for r in rows] == [
        (True, "passed", 0.95),  # no END marker: the structural share is missing
        (False, "gated", 0.0),
    ]
    summary = summarize(rows, k=2)
    assert (summary["pass@1"], summary["pass@2"], summary["mean_reward"]) == (0.5, 1.0, 0.475)


def test_evaluate_runs_multipl_e_protocol_on_a_local_export(tmp_path, tiny_model, one_torch_thread):
    from evaluate import main

    export = tmp_path / "humaneval-ml"
    export.mkdir()
    (export / "test.jsonl").write_text(HUMANEVAL.read_text())
    out = tmp_path / "eval"
    args = [str(tiny_model), "--problems", str(export), "--protocol", "multipl-e", "-n", "2", "-k", "2"]
    assert main([*args, "--out-dir", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "eval_model.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(isinstance(r["passed"], bool) for r in rows)
    assert {r["problem_id"] for r in rows} <= {"HumanEval_0_larger", "HumanEval_3_shout"}  # the usable ones
    assert not any(stop in r["completion"] for r in rows for stop in multipl_e.MULTIPL_E.stop)
    report = (out / "eval_report.md").read_text()
    assert "MultiPL-E's protocol: raw prompt, temperature 0.2, top-p 0.95, up to 512 new tokens" in report


def test_score_cli_matches_completions_by_name_and_repairs_when_asked():
    import subprocess
    import sys

    root = FIXTURES.parents[1]
    command = [
        sys.executable,
        "rewards.py",
        "score",
        str(HUMANEVAL),
        str(ANSWERS),
        "--min-non-empty-lines",
        "0",
    ]
    plain = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=120)
    repaired = subprocess.run(
        [*command, "--repair-problems"], cwd=root, capture_output=True, text=True, timeout=120
    )
    kinds = [json.loads(line)["kind"] for line in ANSWERS.read_text().splitlines()]
    stages = {
        name: [
            (kind, json.loads(line)["stage"])
            for kind, line in zip(kinds, run.stdout.splitlines(), strict=True)
        ]
        for name, run in (("plain", plain), ("repaired", repaired))
    }
    # Unrepaired, the `(~N)` and `.N` problems fail to compile whatever the answer; repaired, they are fair.
    assert stages["plain"] == [
        *[("right", "passed"), ("wrong", "tests_failed")],
        *[("right", "compile_error"), ("wrong", "compile_error")] * 2,
        *[("right", "passed"), ("wrong", "tests_failed")],
        *[("right", "compile_error"), ("wrong", "compile_error")],
    ]
    assert stages["repaired"][:8] == [("right", "passed"), ("wrong", "tests_failed")] * 4
    assert (
        "REPAIR_PROBLEMS: 4 negative literals `(~N)`, 1 float `.N` repaired in 2 of 5 problems"
        in repaired.stderr
    )
