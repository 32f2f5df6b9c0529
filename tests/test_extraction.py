"""Reply shapes of instruction-tuned models: each must read as the plain answer it holds, and score as it."""

import pytest
from test_rewards import NO_GATE, PROBLEM, TESTS, indented

import rewards
from rewards import END_MARKER, score_batch

PARSED = rewards.parse_problem(PROBLEM)
HELPER_FIRST = """let add (a : int) (b : int) : int = a + b

let sum_list (xs : int list) : int =
  List.fold_left add 0 xs"""
COMMENT_FIRST = """(* Fold the list with ( + ), starting from 0. *)
let sum_list (xs : int list) : int =
  List.fold_left ( + ) 0 xs"""
# Gets the signature: `let sum_list = ... in` inside a body is a local value, not the answer's definition.
BODY_WITH_LOCAL_OF_THE_SAME_NAME = """let total = ref 0 in
let sum_list = List.iter (fun x -> total := !total + x) xs in
ignore sum_list;
!total"""


def solution(completion: str) -> str:
    return rewards.assemble_solution(PARSED, rewards.extract_code(completion, PARSED.function))


def scores(completions: list[str]) -> list[dict]:
    return score_batch([{"problem": PROBLEM, "tests": TESTS, "completion": c} for c in completions], NO_GATE)


@pytest.mark.parametrize("indent", ["  ", "    ", "        ", "\t"], ids=["2", "4", "8", "tab"])
@pytest.mark.parametrize("code", [HELPER_FIRST, COMMENT_FIRST], ids=["helper first", "comment first"])
def test_uniformly_indented_block_reads_as_the_block_unindented(indent: str, code: str):
    plain = f"```ocaml\n{code}\n{END_MARKER}\n```"
    replies = [
        f"Steps:\n\n1. Fold the list:\n{indented(plain, indent)}",  # the fences indented with the code
        f"```ocaml\n{indented(code, indent)}\n```\n{END_MARKER}",
        f"Here is the solution:\n\n{indented(code, indent)}\n{END_MARKER}",  # Markdown's indented code block
    ]
    assert [solution(r) for r in replies] == [solution(plain)] * 3
    assert [r["total_reward"] for r in scores(replies)] == [1.0, 1.0, 1.0]


def test_a_local_value_named_like_the_function_is_not_its_definition():
    body = BODY_WITH_LOCAL_OF_THE_SAME_NAME
    replies = [f"{body}\n{END_MARKER}", f"```ocaml\n{indented(body, '  ')}\n{END_MARKER}\n```"]
    assert all(solution(r).startswith(PARSED.signature.replace("let ", "let rec ", 1)) for r in replies)
    assert [r["total_reward"] for r in scores(replies)] == [1.0, 1.0]


def test_only_the_common_indentation_is_removed():
    # The first line sets no indentation for the rest; mixed tabs and spaces share none.
    assert rewards.extract_code("```ocaml\nlet f x =\n  x\n```", "f") == "let f x =\n  x"
    assert rewards.extract_code("```\n\tlet g = 1\n  let f x = x\n```", "f") == "\tlet g = 1\n  let f x = x"
    assert rewards.extract_code("```\n    let f x =\n      x\n\n    (* done *)\n```", "f") == (
        "let f x =\n  x\n\n(* done *)"
    )


DEFINITION = "let sum_list (xs : int list) : int =\n  List.fold_left ( + ) 0 xs"
USAGE = 'let () = Printf.printf "%d\\n" (sum_list [1; 2; 3])'
REPLIES = {
    "```ml tag": f"```ml\n{DEFINITION}\n{END_MARKER}\n```",
    "```OCaml tag": f"```OCaml\n{DEFINITION}\n{END_MARKER}\n```",
    "fence closed on the last code line": f"```ocaml\n{DEFINITION}```\n\nIt folds the list.\n{END_MARKER}",
    "usage example block after": f"```ocaml\n{DEFINITION}\n```\nFor example:\n"
    f"```ocaml\n{USAGE}\n```\n{END_MARKER}",
    "usage example block first": f"Call it so:\n```ocaml\n# sum_list [1; 2];;\n- : int = 3\n```\n"
    f"```ocaml\n{DEFINITION}\n```\n{END_MARKER}",
    "Windows line ends": f"Here it is:\n\n```ocaml\n{DEFINITION}\n{END_MARKER}\n```\n".replace("\n", "\r\n"),
}


@pytest.mark.parametrize("shape", REPLIES)
def test_reply_shapes_read_as_the_definition_they_hold(shape: str):
    reply = REPLIES[shape]
    assert rewards.extract_code(reply, PARSED.function) == DEFINITION
    assert scores([reply])[0]["total_reward"] == 1.0


def test_a_body_only_reply_takes_the_first_block():
    reply = f"```ocaml\n  List.fold_left ( + ) 0 xs\n```\nThen:\n```ocaml\n{USAGE}\n```\n{END_MARKER}"
    assert rewards.extract_code(reply, PARSED.function) == "List.fold_left ( + ) 0 xs"
    assert scores([reply])[0]["total_reward"] == 1.0
