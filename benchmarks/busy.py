"""CPU-bound processes beside a measurement: the load the benchmarks hold a verdict up against.

The benchmarks run as scripts (``python benchmarks/NAME.py``), so they import this module by its
bare name from their own folder. Each busy process is a pure-Python loop that holds one core.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from contextlib import contextmanager


def spin() -> None:
    """Hold one core until terminated."""
    while True:
        pass


@contextmanager
def busy_processes(count: int) -> Iterator[None]:
    """``count`` CPU-bound processes for the duration of the block, stopped however it ends."""
    workers = [multiprocessing.Process(target=spin, daemon=True) for _ in range(count)]
    for worker in workers:
        worker.start()
    try:
        yield
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.join()
