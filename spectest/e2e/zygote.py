"""Start processes as forks of one that has already imported what they need (a *zygote*).

An engine in its own process (:mod:`spectest.e2e.isolated`) starts with a fresh ``spawn``: nothing of
pytest's state is inherited, and every start imports the engine again. For vLLM that import is most of a
start (9-15 s here, of which building the engine is about 3), and an engine that crashed must restart for
the next property. A zygote is a process spawned once that runs a ``prepare`` function (the imports) and
then, on request, ``fork``\\ s a child that runs ``target(*args)``: the child has the imports already, and
nothing of pytest's either (the zygote was spawned).

The child is the zygote's, not this process's: this process cannot ``waitpid`` it, so the zygote reaps it
and reports its exit status (:class:`ForkedProcess` answers ``exitcode``, ``is_alive``, ``kill`` and
``join`` as a ``multiprocessing.Process`` does, asking the zygote). The zygote itself runs nothing but
``prepare`` and ``fork``: no engine, no call, so a crash in a child never reaches it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

PREPARE_SECONDS = 600.0  # imports, as long as a start may take
ANSWER_SECONDS = 60.0  # a fork or a status: the zygote does nothing else


def _child(connection: Any, target: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """In the forked child: ``target(*args)`` and exit, never returning into the zygote's loop."""
    code = 0
    try:
        connection.close()  # the zygote's pipe stays the zygote's
        target(*args)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)


def _main(connection: Any, prepare: Callable[[], None]) -> None:
    """The zygote: ``prepare()`` once, then answer ``("fork", target, args)`` with the child's pid and
    ``("status", pid)`` with its exit status (None while it runs)."""
    try:
        prepare()
        connection.send(None)
    except BaseException as exc:  # the children import what they need themselves: slower, not wrong
        connection.send(f"{type(exc).__name__}: {exc}")
    codes: dict[int, int] = {}
    while True:
        try:
            request = connection.recv()
        except (EOFError, OSError):  # the process that spawned it is gone
            return
        if request[0] == "fork":
            _, target, args = request
            pid = os.fork()
            if pid == 0:
                _child(connection, target, args)
            for arg in args:  # a pipe handed to the child is the child's alone
                if isinstance(arg, Connection):
                    arg.close()
            connection.send(pid)
        elif request[0] == "status":
            pid = request[1]
            if pid not in codes:
                try:
                    done, status = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:  # not (or no longer) its child: nothing to report but an end
                    done, status = pid, 0
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
            connection.send(codes.get(pid))


class Zygote:
    """This process's handle on a zygote; ``prepare`` must pickle (a module-level function, or a
    ``functools.partial`` of one)."""

    def __init__(self, prepare: Callable[[], None]) -> None:
        context = multiprocessing.get_context("spawn")
        self._connection, child = context.Pipe()
        self._process = context.Process(target=_main, args=(child, prepare), daemon=True)
        self._process.start()
        child.close()
        self._lock = threading.Lock()
        self._prepared = False
        self.prepare_error: str | None = None  # what ``prepare`` raised (its forks then import for themselves)

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def alive(self) -> bool:
        return self._process.is_alive()

    def _ask(self, request: tuple[Any, ...]) -> Any:
        with self._lock:
            if not self._prepared:  # ``prepare`` runs once, before the zygote's first answer
                if not self._connection.poll(PREPARE_SECONDS):
                    raise TimeoutError(f"the zygote did not finish preparing within {PREPARE_SECONDS:g} s")
                self.prepare_error = self._connection.recv()
                self._prepared = True
            self._connection.send(request)
            if not self._connection.poll(ANSWER_SECONDS):
                raise TimeoutError(f"the zygote did not answer {request[0]} within {ANSWER_SECONDS:g} s")
            return self._connection.recv()

    def fork(self, target: Callable[..., Any], *args: Any) -> ForkedProcess:
        """A child running ``target(*args)`` (a pipe among ``args`` is handed over, and closed here by the
        caller as it would be after a ``Process.start``)."""
        return ForkedProcess(self._ask(("fork", target, args)), self)

    def exitcode(self, pid: int) -> int | None:
        try:
            return self._ask(("status", pid))
        except (OSError, EOFError, TimeoutError):  # the zygote is gone, its children's statuses with it
            return None if _exists(pid) else -signal.SIGKILL


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class ForkedProcess:
    """A zygote's child, with the part of ``multiprocessing.Process`` that :mod:`spectest.e2e.isolated` uses."""

    def __init__(self, pid: int, zygote: Zygote) -> None:
        self.pid, self.zygote, self._code = pid, zygote, None

    @property
    def exitcode(self) -> int | None:
        if self._code is None:
            self._code = self.zygote.exitcode(self.pid)
        return self._code

    def is_alive(self) -> bool:
        return self.exitcode is None

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def join(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.exitcode is None and time.monotonic() < deadline:
            time.sleep(0.02)


_ZYGOTES: dict[str, Zygote] = {}


def zygote_for(key: str, prepare: Callable[[], None]) -> Zygote:
    """The zygote prepared by ``prepare`` under ``key`` (started on first use, again if it died)."""
    zygote = _ZYGOTES.get(key)
    if zygote is None or not zygote.alive:
        zygote = _ZYGOTES[key] = Zygote(prepare)
    return zygote
