"""Shared test set-up. Nothing is skipped silently: without OCaml the whole run fails and says why."""

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def pytest_sessionstart(session: pytest.Session) -> None:
    missing = [tool for tool in ("ocamlc", "ocamlfind") if shutil.which(tool) is None]
    if missing:
        pytest.exit(
            f"OCaml toolchain missing ({', '.join(missing)} not on PATH): run `make install`",
            returncode=1,
        )


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's tiny Qwen2 model and tokenizer, built once and shared by every test that trains."""
    from demo import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def one_torch_thread():
    """As the demo does: the tiny model gains nothing from more threads, and they contend with the suite."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def run_python() -> Callable[..., subprocess.CompletedProcess]:
    """`python ARGS...` as a user runs it, from the repository root, its output captured as text."""

    def run(*args: str, timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
        )

    return run
