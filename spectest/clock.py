"""A clock for speed measurements that other processes cannot steal from.

Wall-clock time on a shared machine includes the time this thread sat on a run queue while
other processes held the CPUs. On Linux the kernel counts that wait per thread
(``/proc/thread-self/schedstat``, second field), so wall time minus the run-queue delay is the
time the thread itself spent: computing, or waiting on its own account (sleeps, I/O, a device
synchronisation). That is the quantity a speed model predicts, and it barely moves when the
machine gets busy. Elsewhere the clock falls back to the thread's CPU time, which excludes
voluntary waits too (a verifier that sleeps then looks free), and says so in its name.

Measure on one thread: the clock is per thread, so the timed work must run on the calling
thread (``single_threaded`` pins torch's intra-op pool to one thread while timing).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

SCHEDSTAT = "/proc/thread-self/schedstat"


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
def single_threaded() -> Iterator[None]:
    """Torch's intra-op pool pinned to the calling thread (restored after), and the garbage
    collector paused, so that every cost lands on the thread the clock watches."""
    import gc

    import torch

    threads = torch.get_num_threads()
    collecting = gc.isenabled()
    torch.set_num_threads(1)
    gc.disable()
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        if collecting:
            gc.enable()
