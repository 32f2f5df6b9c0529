"""A pytest plugin: every test fails, at its teardown, that leaves this process changed in a way a later test
or a child inherits (tests/conftest.py loads it for the whole suite)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys

import psutil  # accelerate's dependency
import pytest

# Set by a library once, on first use, for the rest of the process, whichever test happens to be first.
PROCESS_WIDE = {
    "PYTEST_CURRENT_TEST",  # pytest's own: the test running now
    "TORCHINDUCTOR_CACHE_DIR",  # torch's inductor: where compiled kernels are cached, for its workers too
    "TOKENIZERS_PARALLELISM",  # transformers' generate turns the tokenizers library's threads off
}


def process_state() -> dict[str, set[str]]:
    """What a test may change in this process and must put back: signal dispositions and the blocked-signal
    mask (a child inherits an ignored or blocked signal across exec), the environment (every child inherits
    it), child processes and listening sockets (a server a later test or the next run collides with)."""
    me = psutil.Process()
    children = set()
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):  # it ended meanwhile
            children.add(
                f"pid {child.pid} ({child.status()}): {' '.join(child.cmdline())[:200] or child.name()}"
            )
    listening = {f"{c.laddr.ip}:{c.laddr.port}" for c in me.net_connections("inet") if c.status == "LISTEN"}
    return {
        "signal disposition": {f"{signal_name(n)}: {signal.getsignal(n)!r}" for n in signal.valid_signals()},
        "blocked signal": {signal_name(n) for n in signal.pthread_sigmask(signal.SIG_BLOCK, [])},
        "environment variable": {f"{k}={v}" for k, v in os.environ.items() if k not in PROCESS_WIDE},
        "child process": children,
        "listening socket": listening,
    }


def signal_name(number: int) -> str:
    """SIGINT, ...; a real-time signal by its number."""
    with contextlib.suppress(ValueError):
        return signal.Signals(number).name
    return f"signal {number}"


@pytest.fixture(autouse=True)
def leaves_nothing_behind():
    """Fails the test (at teardown) that leaves a signal disposition, an environment variable, a child
    process or a listening socket changed. The reward's shared sandbox pools, which a scoring call starts and
    keeps for the process, are stopped first: each test starts its own."""
    before = process_state()
    yield
    if "rewards" in sys.modules:
        sys.modules["rewards"].close_shared_pools()
    after = process_state()
    changes = [
        f"{kind} {sign} {item}"
        for kind in before
        for sign, items in (("+", after[kind] - before[kind]), ("-", before[kind] - after[kind]))
        for item in sorted(items)
    ]
    if changes:
        pytest.fail("the test left this process changed:\n" + "\n".join(changes), pytrace=False)
