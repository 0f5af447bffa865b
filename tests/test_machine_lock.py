"""The lock that lets a timing meta-test run alone (tests/conftest.py): it waits for the tests running
beside it, keeps new ones out while it waits and runs, and lets the rest share the machine."""

from __future__ import annotations

import threading
import time

from tests.conftest import machine


def _enter(shared, alone, entered, leave):
    with machine(shared, alone=alone):
        entered.set()
        leave.wait(10)


def _start(shared, alone):
    entered, leave = threading.Event(), threading.Event()
    thread = threading.Thread(target=_enter, args=(shared, alone, entered, leave), daemon=True)
    thread.start()
    return thread, entered, leave


def test_tests_share_the_machine(tmp_path):
    first = _start(tmp_path, False)
    second = _start(tmp_path, False)
    assert first[1].wait(5) and second[1].wait(5)
    for _, _, leave in (first, second):
        leave.set()


def test_an_alone_test_waits_for_running_tests_and_keeps_new_ones_out(tmp_path):
    running = _start(tmp_path, False)
    assert running[1].wait(5)
    alone = _start(tmp_path, True)
    time.sleep(0.3)
    assert not alone[1].is_set(), "the alone test started beside a running test"
    late = _start(tmp_path, False)
    time.sleep(0.3)
    assert not late[1].is_set(), "a new test got in while the alone test waited (it could starve)"
    running[2].set()
    assert alone[1].wait(5)
    time.sleep(0.3)
    assert not late[1].is_set(), "a test ran beside the alone test"
    alone[2].set()
    assert late[1].wait(5)
    late[2].set()
