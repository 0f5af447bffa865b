"""The process keeps freed memory for the next call (glibc): a freed tensor's pages are reused, not faulted again."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc's malloc settings"
)

ALLOCATE = """
import ctypes, resource, sys
import torch
from spectest.speed.memory import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, keep_freed_memory

# glibc's settings at start, held fixed: its own thresholds move with what was freed before (torch's import
# included), which made the default's faults differ from run to run.
mallopt = ctypes.CDLL("libc.so.6").mallopt
assert mallopt(M_MMAP_THRESHOLD, 128 << 10) == 1 and mallopt(M_TRIM_THRESHOLD, 128 << 10) == 1
applied = keep_freed_memory() if sys.argv[1] == "keep" else None
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def burst():
    tensors = [torch.ones(1 << 18) for _ in range(64)]  # 64 tensors of 1 MiB, then all freed
    del tensors
burst(); burst()
before = faults()
for _ in range(5):
    burst()
print(applied, faults() - before)
"""


def allocate(mode: str, **env: str) -> tuple[str, int]:
    """(what keep_freed_memory returned, page faults of five bursts of 64 tensors of 1 MiB, each burst freed before
    the next, after two) in a fresh process."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run(
        [sys.executable, "-c", ALLOCATE, mode], env={**clean, **env}, capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0], int(out[1])


def test_freed_tensors_are_reused_without_page_faults():
    """Five bursts of 64 MiB in 1 MiB tensors: glibc's settings at start (128 KiB thresholds) hand the freed burst
    back to the kernel and fault every page again (about 16 000 faults of 4 KiB pages a burst); with the heap kept,
    the pages are reused."""
    _, plain = allocate("plain")
    applied, kept = allocate("keep")
    assert applied == "True"
    assert plain > 5 * 8000, plain  # what the setting is there to remove
    assert kept < plain / 20, (kept, plain)


def test_a_users_malloc_settings_are_left_alone():
    """A user who set glibc's malloc settings keeps them: the harness changes nothing (the faults stay)."""
    applied, faults = allocate("keep", MALLOC_TOP_PAD_="131072")  # glibc's default top pad: a no-op setting
    assert applied == "False"
    assert faults > 5 * 8000, faults
