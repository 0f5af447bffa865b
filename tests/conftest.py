"""Harness tests that time things run alone.

The harness tier runs on two xdist workers. A meta-test that times an implementation measures
whatever runs beside it too: the other worker's statistical tests compete for memory bandwidth and
caches, which no clock can subtract (the speed property's own clock only removes the time its
thread waited for a CPU). Tests marked ``alone`` hold the machine: while one runs, no other test of
the run starts, and it starts only once the tests running beside it have finished. Every other
test shares the machine with every other.

A writer-preferring lock over two ``flock`` files in the run's shared temporary directory: a test
passes a turnstile, then holds the room shared; an ``alone`` test holds the turnstile (no new test
gets in) while it waits for the room, then holds the room alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "alone: a timing meta-test; no other test of the run executes while it runs (tests/conftest.py)"
    )
    config.addinivalue_line(
        "markers",
        "cost(seconds): about how long the test takes in CI (its --durations line); the costliest start first",
    )


def cost(item: pytest.Item) -> float:
    marker = item.get_closest_marker("cost")
    return float(marker.args[0]) if marker is not None else 0.0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Start the costliest tests first (a stable sort: the rest keep their order), so that no long test starts as
    the other worker runs out of tests (with ``--dist worksteal``, as CI runs the harness and slow tiers, a worker
    that runs out takes half of the other's queue). A guard more than a saving today: the longest tests run nested
    pytest on two workers of their own, which keep both cores busy wherever they start (CI's slow tier took 1 152 s
    before and after). Ordering changes no outcome: every test sets up what it needs, and each seed is its own."""
    items.sort(key=lambda item: -cost(item))


@contextlib.contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, mode)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def machine(shared: Path, *, alone: bool) -> Iterator[None]:
    """Share the machine with the run's other tests, or (``alone``) hold it."""
    turnstile, room = shared / "machine.turnstile", shared / "machine.room"
    if alone:
        with _flock(turnstile, fcntl.LOCK_EX), _flock(room, fcntl.LOCK_EX):
            yield
        return
    with _flock(turnstile, fcntl.LOCK_EX):
        pass
    with _flock(room, fcntl.LOCK_SH):
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Setup (session fixtures a test is the first to ask for included), call and teardown of each
    test inside its share of the machine, or holding it."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # one process: nothing runs beside a test
        return (yield)
    shared = item.config._tmp_path_factory.getbasetemp().parent  # the run's, common to its workers
    with machine(shared, alone=item.get_closest_marker("alone") is not None):
        return (yield)
