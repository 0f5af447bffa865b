"""A clock for speed measurements that other processes cannot steal from.

Wall-clock time on a shared machine includes the time this thread sat on a run queue while
other processes held the CPUs. On Linux the kernel counts that wait per thread
(``/proc/thread-self/schedstat``, second field), so wall time minus the run-queue delay is the
time the thread itself spent: computing, or waiting on its own account (sleeps, I/O, a device
synchronisation). That is the quantity a speed model predicts, and it barely moves when the
machine gets busy. Elsewhere the clock falls back to the thread's CPU time, which excludes
voluntary waits too (a verifier that sleeps then looks free), and says so in its name.

The kernel's count is not perfect: on a loaded machine it can now and then book part of a sleep as
run-queue wait (CI once saw 4.5 ms of a 50 ms sleep; a sleeping task that the load balancer moves
is a plausible cause), so a single wait can read short. It never reads long, which is the side a
speed verdict must not err on; repeats and medians absorb the rest.

Measure on one thread: the clock is per thread, so the timed work must run on the calling
thread (``single_threaded`` pins torch's intra-op pool to one thread while timing).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator

SCHEDSTAT = "/proc/thread-self/schedstat"
# A machine where identical timed runs spread more than this (interquartile range over the median,
# on the own clock) cannot be timed: speed properties skip, saying so, rather than judge.
NOISE_LIMIT = 0.5
QUIET_SPREAD = 0.1  # a series this quiet settles the question: the machine can be timed


class OwnClock:
    """Seconds of this thread's own time: ``clock()`` like ``time.perf_counter()``."""

    def __init__(self) -> None:
        self._local = threading.local()
        self.counts_waits = self._run_delay() is not None
        self.name = "wall time minus run-queue delay (Linux schedstat)" if self.counts_waits else "thread CPU time"

    def _run_delay(self) -> int | None:
        """Nanoseconds this thread has waited on a run queue, or None where the kernel doesn't say."""
        fd = getattr(self._local, "fd", None)
        if fd is None:
            try:
                fd = os.open(SCHEDSTAT, os.O_RDONLY)  # bound to the opening thread: one per thread
            except OSError:
                fd = -1
            self._local.fd = fd
        if fd < 0:
            return None
        try:
            return int(os.pread(fd, 128, 0).split()[1])
        except (OSError, IndexError, ValueError):
            return None

    def __call__(self) -> float:
        if not self.counts_waits:
            return time.thread_time()
        delay = self._run_delay()
        return (time.perf_counter_ns() - (delay or 0)) / 1e9


OWN_CLOCK = OwnClock()


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """Torch's intra-op pool pinned to the calling thread, restored after (for tiny models more
    threads only spin, and their CPU counts)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def single_threaded() -> Iterator[None]:
    """Torch's intra-op pool pinned to the calling thread (restored after), and the garbage
    collector paused, so that every cost lands on the thread the clock watches."""
    import gc

    collecting = gc.isenabled()
    gc.disable()
    try:
        with one_torch_thread():
            yield
    finally:
        if collecting:
            gc.enable()


def spread(values: list[float]) -> float:
    """Interquartile range over median of repeated timings (0 for fewer than four)."""
    if len(values) < 4:
        return 0.0
    q1, q2, q3 = statistics.quantiles(values, n=4)
    return (q3 - q1) / q2 if q2 > 0 else float("inf")


def timing_noise(
    run: Callable[[], object],
    *,
    clock: Callable[[], float] = OWN_CLOCK,
    repeats: int = 15,
    attempts: int = 3,
    warm: int = 3,
) -> float:
    """Can this machine be timed? The smallest :func:`spread` of up to ``attempts`` series of
    ``repeats`` identical runs, after ``warm`` untimed ones (the first runs after start-up pay for
    cold caches and pages): one quiet series shows the clock can time the machine; a machine noisy
    in every series cannot. The caller holds :func:`single_threaded`."""
    for _ in range(warm):
        run()
    spreads: list[float] = []
    for _ in range(attempts):
        times = []
        for _ in range(repeats):
            started = clock()
            run()
            times.append(clock() - started)
        spreads.append(spread(times))
        if spreads[-1] <= QUIET_SPREAD:
            break
    return min(spreads)


_ENGINE_PROCESSES_CPU_S = [0.0]


def add_engine_process_cpu(seconds: float) -> None:
    """Count ``seconds`` of CPU an engine spent in a process of its own answering a call
    (:mod:`spectest.e2e.isolated`): this process only waits for it, yet it is the implementation's
    work, which the run's budget and the report's "implementation calls" are about."""
    _ENGINE_PROCESSES_CPU_S[0] += max(0.0, float(seconds))


def cpu_time() -> float:
    """CPU seconds of the whole process, every thread included, and of the calls answered by engines in
    processes of their own: work, not waiting."""
    return time.process_time() + _ENGINE_PROCESSES_CPU_S[0]


class Ledger:
    """Time spent per category inside one property run: the implementation's calls, the
    statistics, and (the rest of the run) the harness generating inputs. It decides when a slow
    implementation has used its budget, on a clock that time given to other processes never
    moves: the process's CPU time for CPU work (the calling thread's own time would count its
    wait for torch's helper threads, which a busy machine delays), the own clock for a GPU (where
    the host mostly waits on the device)."""

    def __init__(self, clock: Callable[[], float] = OWN_CLOCK) -> None:
        self.clock = clock
        self.spent: dict[str, float] = {}
        self.started = clock()

    @contextlib.contextmanager
    def measure(self, category: str) -> Iterator[None]:
        started = self.clock()
        try:
            yield
        finally:
            self.spent[category] = self.spent.get(category, 0.0) + self.clock() - started

    def total(self, category: str) -> float:
        return self.spent.get(category, 0.0)

    def split(self) -> dict[str, float]:
        """Seconds by category, the rest of the run as ``inputs`` (case generation and bookkeeping);
        ``scoring_s``, where measured, is the part of ``calls_s`` that scored the implementation
        (an engine's teacher forcing) rather than ran it."""
        elapsed = self.clock() - self.started
        split = {"calls_s": self.total("calls"), "statistics_s": self.total("statistics")}
        split["inputs_s"] = max(0.0, elapsed - sum(split.values()))
        split["total_s"] = elapsed
        if "scoring" in self.spent:
            split["scoring_s"] = self.total("scoring")
        return split
