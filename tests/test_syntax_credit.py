"""REWARD_SYNTAX_CREDIT with the real compiler: a syntax error a few token edits from parsing earns a little
of the type-check share, so that a group of failing completions still ranks; padding, junk and breaking a
parsed answer on purpose never pay."""

from __future__ import annotations

import random

import pytest
from test_rewards import PROBLEM, TESTS, fenced

import envflags
from ocaml_sandbox import Job, SandboxPool
from rewards import RewardConfig, score_batch

CREDIT = RewardConfig(reward_syntax_credit=True)  # the default gate: every answer below has 8+ code lines
OFF = RewardConfig()

# A real-looking answer (9 code lines), and the mistakes the real Qwen2.5-Coder-0.5B makes, one token each.
RIGHT = """let rec add_all acc = function
  | [] -> acc
  | x :: rest -> add_all (acc + x) rest

let rec sum_list (xs : int list) : int =
  match xs with
  | [] -> 0
  | _ ->
    let total = add_all 0 xs in
    total"""
BREAKS = {
    "missing in": (" xs in\n", " xs\n"),
    "doubled rec": ("let rec add_all", "let rec rec add_all"),
    "unclosed parenthesis": ("let total = ", "let total = ("),
}


def broken(program: str, mistake: str) -> str:
    old, new = BREAKS[mistake]
    assert old in program, (mistake, program)
    return program.replace(old, new, 1)


BROKEN = {
    **{mistake: broken(RIGHT, mistake) for mistake in BREAKS},
    # Found at the next `let`, not at the end of the text.
    "missing in before a let": RIGHT.replace(
        "let total = add_all 0 xs in", "let first = 0\n    let total = add_all first xs in"
    ),
    # Repaired as `(acc + x rest)`, which has a type error of its own: still a quarter of the share.
    "unclosed parenthesis in a helper": RIGHT.replace("(acc + x) rest", "(acc + x rest"),
}
# Parsed answers that earn less than RIGHT, each with the three places BREAKS breaks.
WRONG = RIGHT.replace("(acc + x)", "(acc - x)")  # passes 1 test of 4
ONE_TYPE_ERROR = RIGHT.replace("    total", '    total ^ "!"')
# Every definition fails to type, each for its own reason: 4 type errors, nothing typed. It earns less for
# type-checking (0.2 x 0.5 / 4) than a flat quarter share would pay any one-token break of it.
EVERY_DEFINITION_FAILS = """let rec add_all acc = function
  | [] -> acc
  | x :: rest -> add_all (acc + x) rest ^ ""

let scale = 2 +. 1.0
let label = "sum" ^ 1

let rec sum_list (xs : int list) : int =
  match xs with
  | [] -> 0
  | _ ->
    let total = List.fold_left ( + ) 0 xs in
    total +. 0.0"""
PARSED = {
    "right": RIGHT,
    "wrong": WRONG,
    "one type error": ONE_TYPE_ERROR,
    "every definition fails": EVERY_DEFINITION_FAILS,
}

FILLER = "\n".join(["let _ = 0"] * 30)
HELPERS = """let double x = 2 * x
let square x = x * x
let rec length = function [] -> 0 | _ :: rest -> 1 + length rest
let compose f g x = f (g x)"""
PROSE = """To sum the list we walk through it and add every element to an accumulator.
The sum of the empty list is zero, which is the base case of the recursion.
For a list with a head and a tail, the sum is the head plus the sum of the tail.
This runs in linear time, and it uses a stack frame for each element of the list.
A tail-recursive version would carry the running total in an accumulator instead.
Either way, the function returns an integer, and it never raises an exception.
I hope this helps! Let me know if you have any other questions about OCaml.
Happy coding, and good luck with the rest of the exercises."""
PYTHON = """def sum_list(xs):
    total = 0
    for x in xs:
        total += x
    return total


def main():
    print(sum_list([1, 2, 3]))
    if sum_list([]) == 0:
        print("ok")"""
WALL = "\n".join(["(" * 40] * 10)
VOCABULARY = [
    *("let", "rec", "in", "=", "->", "match", "with", "|", "(", ")", "[", "]", "if", "then", "else"),
    *("fun", "x", "xs", "acc", "0", "1", "+", "::", ";", "begin", "end", "for", "to", "do", "done"),
    *("List.map", "f", "when", "function", "type", "of"),
]


def random_tokens(seed: int) -> str:
    rng = random.Random(seed)
    return "\n".join(" ".join(rng.choice(VOCABULARY) for _ in range(8)) for _ in range(10))


JUNK = {
    "English prose": PROSE,
    "Python code": PYTHON,
    "a wall of parentheses": WALL,
    **{f"random tokens {seed}": random_tokens(seed) for seed in range(8)},
}
# Appended to a parsed answer: the first three are one token from parsing.
TAILS = {
    "an unclosed parenthesis": "let _ = (0",
    "an unclosed list": "let extra = [1; 2",
    "a stray parenthesis": "let _ = 0 )",
    **JUNK,
}


def scores(codes, cfg: RewardConfig = CREDIT, **item) -> list[dict]:
    items = [{"problem": PROBLEM, "tests": TESTS, "completion": fenced(code), **item} for code in codes]
    return score_batch(items, cfg)


def test_the_checker_counts_the_edits_that_make_a_solution_parse():
    lets = "let sum_list (xs : int list) : int =\n  let a = 1{}\n  let b = 2{}\n  let c = 3{}\n  a + b + c\n"
    cases = {
        lets.format(" in", " in", " in"): (0, 0, 0),  # parses
        lets.format("", " in", " in"): (1, 1, 0),
        lets.format("", "", " in"): (1, 2, 0),
        lets.format("", "", ""): (1, 3, 0),
        lets.format("", "", "") + "let d = 4\nlet e =": (1, 0, 0),  # a fourth and a fifth mistake
        "def sum_list(xs):\n    return sum(xs)\n": (1, 0, 0),
        "(" * 30 + "\n": (1, 0, 0),
        # Lexer errors: an unterminated string or comment, an illegal (3-byte) character; each repair
        # leaves a type error (`total` and `add` unbound, one argument too many).
        'let sum_list xs =\n  print_string "total;\n  0\n': (1, 1, 1),
        "let sum_list xs =\n  (* add them up\n  List.fold_left ( + ) 0 xs\n": (1, 1, 1),
        "let sum_list xs = List.fold_left ( + ) 0 xs \u2192 0\n": (1, 1, 1),
        # One edit; the repaired text has two type errors of its own.
        'let a = 1 + "one"\nlet b = 2 +. 1\nlet rec rec sum_list xs = 0\n': (1, 1, 2),
    }
    pool = SandboxPool(workers=1)
    try:
        outcomes = pool.evaluate_many([Job("", code, TESTS, "sum_list") for code in cases])
    finally:
        pool.close()
    found = {
        code: (o.syntax_errors, o.syntax_repairs, o.repaired_type_errors)
        for code, o in zip(cases, outcomes, strict=True)
    }
    assert found == cases


def test_a_real_looking_answer_one_token_from_parsing_earns_a_quarter_of_the_type_check_share():
    for mistake, result in zip(BROKEN, scores(BROKEN.values()), strict=True):
        assert (result["stage"], result["syntax_errors"], result["syntax_repairs"]) == (
            "syntax_error",
            1,
            1,
        ), mistake
        assert result["type_check"] == pytest.approx(0.2 * 0.25), mistake  # half of one type error's 0.1
        assert (result["compile"], result["tests"]) == (0, 0)
        assert result["total_reward"] == pytest.approx(0.05 + 0.05), mistake
        assert result["reason"] == "syntax error (1 edit from parsing)"
    two = scores([broken(broken(RIGHT, "doubled rec"), "missing in")])[0]
    assert (two["syntax_repairs"], two["reason"]) == (2, "syntax error (2 edits from parsing)")
    assert two["type_check"] == pytest.approx(0.2 * 0.25 / 2)


def test_padding_with_valid_lines_earns_exactly_the_same():
    for mistake, code in BROKEN.items():
        own = code.split("\n")
        helpers_between = "\n".join([*own[:4], HELPERS, *own[4:]])
        padded = [
            f"{FILLER}\n{code}",
            f"{code}\n{FILLER}",
            f"{FILLER}\n{code}\n{FILLER}",
            f"{HELPERS}\n{code}\n{HELPERS}",
            helpers_between,
        ]
        alone, *results = scores([code, *padded])
        assert [r["total_reward"] for r in results] == [alone["total_reward"]] * len(padded), mistake
        assert [r["syntax_repairs"] for r in results] == [1] * len(padded), mistake
    # Padding that does not type earns less: the credit is divided by the repaired text's type errors.
    failing = "let bad_helper x = x + 1.0\nlet worse_helper = List.length 3"
    alone, padded = scores([BROKEN["missing in"], f"{failing}\n{BROKEN['missing in']}"])
    assert padded["type_check"] == pytest.approx(alone["type_check"] / 2)


def test_junk_earns_none_of_the_credit():
    codes = [*JUNK.values(), *(f"{FILLER}\n{junk}\n{FILLER}" for junk in JUNK.values())]
    names = [*JUNK, *(f"padded {name}" for name in JUNK)]
    for name, on, off in zip(names, scores(codes), scores(codes, OFF), strict=True):
        assert (on["stage"], on["syntax_repairs"], on["type_check"]) == ("syntax_error", 0, 0), name
        assert on["total_reward"] == off["total_reward"] == 0.05, name
        assert on["reason"] == "syntax error"


def test_appending_junk_never_raises_a_parsed_answers_reward():
    codes = [f"{program}\n{tail}" for program in PARSED.values() for tail in TAILS.values()]
    own = dict(zip(PARSED, (r["total_reward"] for r in scores(PARSED.values())), strict=True))
    results = iter(scores(codes))
    for name in PARSED:
        for tail in TAILS:
            result = next(results)
            assert result["stage"] == "syntax_error", (name, tail)
            assert result["syntax_repairs"] == (tail not in JUNK), (name, tail)  # the first three earn it
            assert result["total_reward"] < own[name], (name, tail, result["total_reward"], own[name])


def test_a_parsed_answer_always_beats_its_one_token_broken_version():
    parsed = scores(PARSED.values())
    assert [r["stage"] for r in parsed] == ["passed", "tests_failed", "type_error", "type_error"]
    assert parsed[-1]["type_errors"] == 4 and parsed[-1]["total_reward"] == pytest.approx(
        0.05 + 0.2 * 0.5 / 4
    )
    for (name, program), whole in zip(PARSED.items(), parsed, strict=True):
        for mistake, result in zip(BREAKS, scores(broken(program, m) for m in BREAKS), strict=True):
            assert result["syntax_repairs"] == 1, (name, mistake)
            assert result["total_reward"] < whole["total_reward"], (name, mistake)
    # A flat quarter share would have paid the break: 0.05 + 0.05 > 0.075.
    assert parsed[-1]["total_reward"] < 0.05 + 0.2 * 0.25


def test_the_gate_and_the_runaway_penalty_still_apply():
    short = "let sum_list xs =\n  let total = List.fold_left ( + ) 0 xs\n  total"
    (gated,) = scores([short])
    assert (gated["stage"], gated["total_reward"], gated["syntax_repairs"]) == ("gated", 0.0, 1)
    assert gated["reason"].endswith("; syntax error (1 edit from parsing)")
    items = [{"problem": PROBLEM, "tests": TESTS, "completion": BROKEN["missing in"], "truncated": True}]
    (runaway,) = score_batch(items, CREDIT)
    assert runaway["runaway_penalty_applied"] and runaway["total_reward"] == pytest.approx(0.3 * 0.05)


# What the reward paid before REWARD_SYNTAX_CREDIT existed (the code of the commit before it, same texts).
BEFORE = {
    "right": 1.0,
    "wrong": 0.5125,
    "one type error": 0.175,
    "every definition fails": 0.075,
    **{f"broken: {mistake}": 0.05 for mistake in BROKEN},
    **{f"junk: {name}": 0.05 for name in JUNK},
}


def test_with_the_setting_off_every_score_is_what_it_was():
    assert OFF.reward_syntax_credit is False
    assert envflags.from_env(RewardConfig, {"REWARD_SYNTAX_CREDIT": "1"}).reward_syntax_credit is True
    codes = [*PARSED.values(), *BROKEN.values(), *JUNK.values()]
    results = scores(codes, OFF)
    assert dict(zip(BEFORE, (r["total_reward"] for r in results), strict=True)) == pytest.approx(BEFORE)
    for result in results:
        if result["stage"] == "syntax_error":
            assert (result["type_check"], result["reason"]) == (0, "syntax error")
    short = "let sum_list xs =\n  let total = List.fold_left ( + ) 0 xs\n  total"
    assert scores([short], OFF)[0]["total_reward"] == 0.0
