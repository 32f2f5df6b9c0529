"""The layout the design promises: one job per top-level module, none over 800 lines, imports that run one
way (type-only imports count too), evaluate.py independent of train.py, and a torch-free reward CLI."""

import ast
import subprocess
import sys
from pathlib import Path

from problems import ROOT

MAX_LINES = 800
MODULES = sorted(ROOT.glob("*.py"))
NAMES = {path.stem for path in MODULES}


def imported_modules(path: Path) -> set[str]:
    """The project's modules that `path` imports anywhere: in functions and under TYPE_CHECKING too."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return (found & NAMES) - {path.stem}


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a path that returns to its start, or None (depth-first search)."""
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> list[str] | None:
        state[name] = "open"
        for dep in sorted(graph[name]):
            if state.get(dep) == "open":
                return [*path[path.index(dep) :], dep]
            if dep not in state and (cycle := visit(dep, [*path, dep])):
                return cycle
        state[name] = "done"
        return None

    return next((c for name in sorted(graph) if name not in state and (c := visit(name, [name]))), None)


def test_no_module_is_over_800_lines() -> None:
    sizes = {path.name: len(path.read_text(encoding="utf-8").splitlines()) for path in MODULES}
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}


def test_imports_run_one_way() -> None:
    graph = {path.stem: imported_modules(path) for path in MODULES}
    assert import_cycle(graph) is None
    assert "train" not in graph["evaluate"]


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert import_cycle({"a": {"b"}, "b": set()}) is None


def test_the_reward_cli_loads_neither_torch_nor_the_trainer() -> None:
    check = "import sys, rewards; print(sorted({'torch', 'transformers', 'trl', 'train'} & set(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
