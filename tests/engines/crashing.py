"""Engines that crash, abort or hang in their own process (spectest.e2e.isolated), for the harness's tests.

Each is the exact Markov engine (tests/engines/markov.py) in a child process, with one fault on its
``generate`` from the given call on: a segmentation fault (the signal native code dies of), an
``abort()`` (a failed C++ check), or a hang in native code that no alarm in the child can interrupt.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from pathlib import Path

from spectest.e2e.isolated import IsolatedWithDraft

HERE = Path(__file__).resolve()


def build(fault: str, from_call: int):
    from markov import MarkovEngine  # the child's path holds this folder (added below)

    class Faulty(MarkovEngine):
        calls = 0

        def generate(self, prompts, params, max_new_tokens, seed):
            Faulty.calls += 1
            if Faulty.calls >= from_call:
                if fault == "segfault":
                    os.kill(os.getpid(), signal.SIGSEGV)
                if fault == "abort":
                    os.abort()
                if fault == "hang":
                    ctypes.CDLL(None).pause()  # blocks in C: the GIL's holder never returns
            return super().generate(prompts, params, max_new_tokens, seed)

        def target_logits(self, sequences):
            if fault == "busy":  # CPU work in the engine's own process, which the harness's clock must see
                _burn(0.5)
            return super().target_logits(sequences)

    class Busy(Faulty):
        def spectest_components(self, context, params):
            """One pass's parts, each a known CPU cost in this process (which the harness must time here)."""
            return {"draft": lambda: _burn(0.2), "target": lambda: _burn(0.1), "verify": lambda: None}

    return Busy() if fault == "busy" else Faulty()


def _burn(seconds: float) -> None:
    started = time.process_time()
    while time.process_time() - started < seconds:
        pass


def _build(**options):
    import sys

    sys.path.insert(0, str(HERE.parent))
    return build(**options)


def _preload() -> None:
    """What a zygote imports once for the forked variant (:class:`Forked`): the engine's module."""
    import sys

    sys.path.insert(0, str(HERE.parent))
    import markov  # noqa: F401


class Isolated(IsolatedWithDraft):
    spectest_engine_capabilities = frozenset({"seeded", "batch-invariant", "standard-rejection"})

    def __init__(self, name: str, **options) -> None:
        super().__init__(name, f"{HERE}:_build", options)


class Forked(IsolatedWithDraft):
    """The same engines, each start a fork of a zygote that preloaded them (as vLLM's adapters start)."""

    spectest_engine_capabilities = Isolated.spectest_engine_capabilities

    def __init__(self, name: str, **options) -> None:
        super().__init__(name, f"{HERE}:_build", options, preload=f"{HERE}:_preload")


segfaults_on_second_call = Isolated("segfaults_on_second_call", fault="segfault", from_call=2)
aborts_on_first_call = Isolated("aborts_on_first_call", fault="abort", from_call=1)
hangs_on_first_call = Isolated("hangs_on_first_call", fault="hang", from_call=1)
isolated_markov = Isolated("isolated_markov", fault="none", from_call=10**9)
