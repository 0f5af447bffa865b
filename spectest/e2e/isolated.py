"""An engine in a process of its own: a crash, an abort or a hang in native code cannot take pytest with it.

Real engines are C++ under Python. A segmentation fault, an ``abort()`` from a failed check, or a
deadlock holding the GIL kills or freezes the process it happens in, and no ``try`` or alarm in that
process can turn it into a verdict. :class:`IsolatedEngine` builds the engine in a child process
(``multiprocessing`` with the ``spawn`` start method: nothing of pytest's state is inherited) and
forwards every call over a pipe. When the child dies, the call raises :class:`EngineDied` naming the
signal or exit code and the call; when it does not answer within the call's limit, it is killed and
the call raises :class:`EngineHung`. Either way the call fails (the engine contract turns the error
into a ``does not raise`` failure naming the engine and the request), the property's verdict is the
engine's, the other properties run on a fresh child, and nothing already written is lost.

Each answer carries the child's CPU seconds for the call, which the run's clock adds to its own
(:func:`spectest.speed.clock.cpu_time`): the budget (``--spec-run-seconds``) and the report's
"implementation calls" are the engine's own work, not the few milliseconds this process spends waiting.
The same seconds, summed, are the engine's clock for the speed property (``spectest_clock``: the child's
CPU time, every thread, which another process's load does not move), and an engine that can run one pass's
parts on their own (``spectest_components``) runs them in the child too, each part a call timed there.

The engine object in the child is built by ``factory(**options)`` (an importable ``module:function``);
it speaks the engine protocol (:mod:`spectest.e2e.protocol`). Arrays cross the pipe as numpy arrays.

An engine whose imports dominate its start (vLLM: 9-15 s a start, of which building it is about 3) names
a ``preload`` (``module:function``): its starts are then forks of a zygote that ran it once
(:mod:`spectest.e2e.zygote`), so a property that crashed the engine restarts it in seconds. A forked child
fails as a spawned one does: a crash, an abort or a hang is reported the same way.
"""

from __future__ import annotations

import functools
import gc
import importlib
import importlib.util
import multiprocessing
import signal
import time
import traceback
from pathlib import Path
from typing import Any

from spectest.speed.clock import add_engine_process_cpu

SPECULATION_OFF = "speculative decoding is off (the control): there is no pass to time"
START_SECONDS = 600.0  # building an engine may convert models on first use
CALL_SECONDS = 600.0  # a call's limit when the harness gives none


class EngineDied(RuntimeError):
    """The engine's process ended during a call (a crash in native code, an abort, an exit)."""


class EngineHung(RuntimeError):
    """The engine's process did not answer a call in time (it was killed)."""


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name} ({-code})"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def load_factory(factory: str) -> Any:
    """``module:function`` or ``path/to/file.py:function``."""
    module, _, name = factory.rpartition(":")
    if module.endswith(".py"):
        spec = importlib.util.spec_from_file_location(f"spectest_isolated_{Path(module).stem}", module)
        loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)
        return getattr(loaded, name)
    return getattr(importlib.import_module(module), name)


def _serve(connection: Any, factory: str, options: dict[str, Any]) -> None:
    """The child: build the engine, then answer (method, args) requests until told to stop."""
    parts: dict[str, Any] = {}
    try:
        engine = load_factory(factory)(**options)
        connection.send(("ok", {"vocab_size": int(engine.vocab_size), "methods": _methods(engine)}))
    except BaseException as exc:  # report it: the parent raises it as the engine's failure to start
        connection.send(("error", (type(exc).__name__, str(exc), traceback.format_exc())))
        return
    while True:
        try:
            method, args = connection.recv()
        except EOFError:
            return
        if method == "stop":
            return
        collecting = gc.isenabled()
        gc.disable()  # a collection lands between calls, not inside the one being timed
        try:
            started = time.process_time()
            if method == COMPONENTS:  # one pass's parts: kept here, named to the parent
                parts = engine.spectest_components(*args)
                result = sorted(parts)
            elif method == PART:
                result = parts[args[0]]()
            else:
                result = getattr(engine, method)(*args)
            seconds = time.process_time() - started
            if hasattr(result, "numpy"):  # a torch tensor: numpy over the pipe
                result = result.detach().cpu().numpy()
            record = {name: getattr(engine, name, None) for name in REPORTED}
            connection.send(("ok", (result, record, seconds)))
        except BaseException as exc:
            connection.send(("error", (type(exc).__name__, str(exc), traceback.format_exc())))
        finally:
            if collecting:
                gc.enable()


def _preload(preload: str) -> None:
    """Run a ``module:function`` preload (in the zygote)."""
    load_factory(preload)()


COMPONENTS, PART = "spectest_components", "spectest_part"  # build one pass's parts; run one of them
METHODS = ("generate", "plain_generate", "target_logits", "draft_logits", COMPONENTS)
REPORTED = (
    "passes",
    "tokens_per_pass",
    "draft_lengths",
    "pass_counts",
    "counters",
)  # what an engine reports after a call


def _methods(engine: Any) -> list[str]:
    return [m for m in METHODS if callable(getattr(engine, m, None))]


class IsolatedEngine:
    """The proxy the harness calls: the engine protocol, answered by a child process."""

    def __init__(
        self, name: str, factory: str, options: dict[str, Any] | None = None, *, preload: str | None = None
    ) -> None:
        """``preload``: a ``module:function`` that imports what the engine needs, run once in a zygote that
        every start of this engine forks (see the module's docstring); None: each start is a fresh spawn."""
        self.name, self.factory, self.options, self.preload = name, factory, dict(options or {}), preload
        self._process: Any = None
        self._connection: Any = None
        self._info: dict[str, Any] | None = None
        self.passes = self.tokens_per_pass = self.draft_lengths = self.pass_counts = self.counters = None
        self.spectest_clock = EngineProcessClock()

    # -- the child's life --------------------------------------------------------------------------
    def _start(self) -> dict[str, Any]:
        if self.preload is not None:
            from spectest.e2e.zygote import zygote_for

            parent, child = multiprocessing.Pipe()
            zygote = zygote_for(self.preload, functools.partial(_preload, self.preload))
            self._process = zygote.fork(_serve, child, self.factory, self.options)
        else:
            context = multiprocessing.get_context("spawn")
            parent, child = context.Pipe()
            self._process = context.Process(target=_serve, args=(child, self.factory, self.options), daemon=True)
            self._process.start()
        child.close()
        self._connection = parent
        status, payload = self._receive(START_SECONDS, f"starting {self.factory}")
        if status == "error":
            kind, message, trace = payload
            self.close()
            raise RuntimeError(f"{self.name} could not start: {kind}: {message}\n{trace[-2000:]}")
        self._info = payload
        return payload

    def _receive(self, seconds: float, what: str) -> tuple[str, Any]:
        try:
            return self._wait(seconds, what)
        except BaseException:  # an alarm or an interrupt mid-call: the child's answer would come too late
            self._kill()
            raise

    def _wait(self, seconds: float, what: str) -> tuple[str, Any]:
        if not self._connection.poll(seconds):
            alive = self._process.is_alive()
            self._kill()
            if alive:
                raise EngineHung(f"{self.name}'s process did not answer {what} within {seconds:g} s: killed")
            raise EngineDied(f"{self.name}'s process died during {what}: {_describe_exit(self._process.exitcode)}")
        try:
            return self._connection.recv()
        except (EOFError, OSError):
            self._process.join(5)
            code = self._process.exitcode
            self._kill()
            raise EngineDied(f"{self.name}'s process died during {what}: {_describe_exit(code)}") from None

    def _kill(self) -> None:
        if self._process is not None and self._process.is_alive():
            self._process.kill()
            self._process.join(5)
        self._process = self._connection = self._info = None

    def close(self) -> None:
        """Stop the child (a later call starts a fresh one)."""
        if self._connection is not None:
            try:
                self._connection.send(("stop", ()))
            except OSError:
                pass
            self._process.join(10)
        self._kill()

    def __del__(self) -> None:
        try:
            self._kill()
        except Exception:
            pass

    @property
    def info(self) -> dict[str, Any]:
        return self._info if self._info is not None else self._start()

    # -- the engine protocol -----------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return int(self.info["vocab_size"])

    def call(self, method: str, *args: Any, seconds: float = CALL_SECONDS) -> Any:
        """``method(*args)`` in the child; its exception, death or silence raised here."""
        known = self.info["methods"]
        if method not in known and not (method == PART and COMPONENTS in known):
            raise AttributeError(f"{self.name} has no {method}")
        if method == PART:
            described = f"its pass's part {args[0]!r}"
        else:
            described = f"{method}({len(args[0]) if args and hasattr(args[0], '__len__') else ''} inputs)"
        try:
            self._connection.send((method, args))
        except (OSError, BrokenPipeError):
            code = self._process.exitcode if self._process is not None else None
            self._kill()
            raise EngineDied(f"{self.name}'s process was gone before {described}: {_describe_exit(code)}") from None
        status, payload = self._receive(seconds, described)
        if status == "error":  # an engine that raised may be left broken (vLLM's core is): the next call starts afresh
            kind, message, trace = payload
            self.close()
            raise RuntimeError(f"{kind}: {message} (in {self.name}'s process)\n{trace[-1500:]}")
        result, record, cpu_s = payload
        add_engine_process_cpu(cpu_s)  # the engine's own work, in its process: the run's clock counts it
        self.spectest_clock.seconds += cpu_s
        for name, value in record.items():
            setattr(self, name, value)
        return result

    def generate(self, prompts, params, max_new_tokens, seed):
        return self.call("generate", prompts, params, max_new_tokens, seed)

    @property
    def spectest_components(self) -> Any:
        """One pass's parts, built and run in the child (each a call, timed there by ``spectest_clock``);
        absent (an ``AttributeError``) when the engine in the child has none."""
        if COMPONENTS not in self.info["methods"]:
            raise AttributeError(f"{self.name} has no {COMPONENTS}")

        def components(context: Any, params: Any) -> dict[str, Any]:
            names = self.call(COMPONENTS, context, params)
            return {name: (lambda name=name: self.call(PART, name)) for name in names}

        return components

    def target_logits(self, sequences):
        import torch

        return torch.from_numpy(self.call("target_logits", sequences))


class EngineProcessClock:
    """The speed property's clock for an engine in a process of its own: the CPU seconds its process
    spent answering calls (every thread; waiting on the pipe, and time other processes took, not counted)."""

    name = "the engine process's CPU time (every thread)"

    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds


class IsolatedWithPlain(IsolatedEngine):
    def plain_generate(self, prompts, params, max_new_tokens, seed):
        return self.call("plain_generate", prompts, params, max_new_tokens, seed)


class IsolatedWithDraft(IsolatedWithPlain):
    def draft_logits(self, sequences):
        import torch

        return torch.from_numpy(self.call("draft_logits", sequences))
