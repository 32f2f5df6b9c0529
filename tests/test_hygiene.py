"""The suite's own hygiene check (tests/hygiene.py) fails each test that leaves something behind, and only
those: a pytest session inside this one runs tests that each leave one thing."""

from pathlib import Path

import pytest

LEAVING = """
import os, signal, socket, subprocess

def test_clean(monkeypatch):
    monkeypatch.setenv("PUT_BACK", "1")
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    signal.signal(signal.SIGUSR2, signal.SIG_DFL)

def test_environment():
    os.environ["LEFT_BEHIND"] = "1"

def test_signal_disposition():
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)

def test_blocked_signal():
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])

def test_child_process():
    subprocess.Popen(["sleep", "5"])

server = socket.socket()

def test_listening_socket():
    server.bind(("127.0.0.1", 0))
    server.listen()
"""


def test_each_test_that_leaves_something_behind_fails_and_says_what(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))  # where the plugin is
    pytester.makepyfile(test_leaving=LEAVING)
    result = pytester.runpytest_subprocess("-p", "hygiene", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=6, errors=5)
    errors = {line.split("::")[1] for line in result.outlines if line.startswith("ERROR test_leaving.py::")}
    assert {e.split(" ")[0] for e in errors} == {
        "test_environment",
        "test_signal_disposition",
        "test_blocked_signal",
        "test_child_process",
        "test_listening_socket",
    }
    result.stdout.fnmatch_lines(
        [
            "*the test left this process changed:",
            "environment variable + LEFT_BEHIND=1",
            "signal disposition + SIGUSR1: <Handlers.SIG_IGN: 1>",
            "blocked signal + SIGUSR2",
            "child process + pid * (*): sleep 5",
            "listening socket + 127.0.0.1:*",
        ],
        consecutive=False,
    )
