"""Checks for data/problems.jsonl: schema, and every problem against the real OCaml compiler."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

PROBLEMS_PATH = Path(__file__).resolve().parents[1] / "data" / "problems.jsonl"
FIELDS = ("id", "prompt", "tests", "solution", "difficulty")
DIFFICULTIES = {"easy", "medium", "hard"}
SIGNATURE_RE = re.compile(r"^let (?:rec )?(?P<name>[a-z_][A-Za-z0-9_']*)(?: \([a-z_][\w']* : .+?\))+ : .+ =$")
STUB_BODY = ' failwith "todo"'
RUN_TIMEOUT_S = 10


def load_problems() -> list[dict[str, str]]:
    with PROBLEMS_PATH.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


PROBLEMS = load_problems()


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


def test_problem_set_shape() -> None:
    assert len(PROBLEMS) >= 40
    ids = [p["id"] for p in PROBLEMS]
    assert len(ids) == len(set(ids)), "duplicate ids"
    for p in PROBLEMS:
        for field in FIELDS:
            assert isinstance(p.get(field), str) and p[field], f"{p.get('id')}: bad field {field}"
        assert p["difficulty"] in DIFFICULTIES, p["id"]
        last_line = [line for line in p["prompt"].splitlines() if line.strip()][-1]
        signature = SIGNATURE_RE.match(last_line)
        assert signature, f"{p['id']}: prompt does not end in a signature: {last_line!r}"
        tests = p["tests"].strip()
        assert tests.startswith("let () =") and tests.endswith(";;"), p["id"]
        asserts = [line for line in tests.splitlines() if line.strip().startswith("assert (")]
        assert len(asserts) >= 4, f"{p['id']}: only {len(asserts)} asserts"
        assert signature["name"] in asserts[0], f"{p['id']}: the first assert does not call the function"


@pytest.mark.parametrize("problem", PROBLEMS, ids=[p["id"] for p in PROBLEMS])
def test_reference_solution_passes(problem: dict[str, str], tmp_path: Path) -> None:
    prompt, solution, tests = problem["prompt"], problem["solution"], problem["tests"]
    compiled, code, output = compile_and_run(prompt, solution, tests, tmp_path)
    assert compiled, f"reference solution does not compile:\n{output}"
    assert code == 0, f"reference solution fails its tests (exit {code}):\n{output}"
    assert output == "", f"program printed output:\n{output}"


@pytest.mark.parametrize("problem", PROBLEMS, ids=[p["id"] for p in PROBLEMS])
def test_stub_fails(problem: dict[str, str], tmp_path: Path) -> None:
    compiled, code, output = compile_and_run(problem["prompt"], STUB_BODY, problem["tests"], tmp_path)
    assert compiled, f"stub program does not compile:\n{output}"
    assert code != 0, "tests pass with a stub body that always raises"
    assert "todo" in output, f"first failure is not the stub being called:\n{output}"
