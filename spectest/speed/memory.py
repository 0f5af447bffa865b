"""Keep freed memory in the process for the next call, instead of handing it back to the kernel (glibc).

A property run allocates and frees tensors of the same few sizes thousands of times: each call's inputs, the
implementation's working rows and output, the counts. glibc serves a block above its mmap threshold (128 KiB at
first, raised as such blocks are freed) with a fresh mapping, unmaps it when it is freed, and trims the top of its
heap past twice that threshold: the next call's tensors are page-faulted, and zeroed by the kernel, again on first
touch. The main job (``pytest --spec-model reference``) took 2.2-3.4 million page faults and 7-10 s of system CPU
of its 62-72 s; with these settings (and the reference's reused rows) 0.9-1.1 million and 4 s (docs/figures.md).

:func:`keep_freed_memory` serves blocks up to :data:`MMAP_BYTES` from the heap and trims the heap only past
:data:`TRIM_BYTES` of free memory at its top, so a freed tensor's pages are reused as they are. Larger blocks are
still mapped and unmapped: served from the heap, a large block allocated again and again (torch asks for aligned
blocks, which glibc cannot always fit back into the one just freed) grew the heap by up to eight times its size
before it settled. The process holds at most :data:`TRIM_BYTES` of freed memory more than it otherwise would.
It is applied once per process, where the harness runs properties, as ``torch.set_num_threads`` is under
pytest-xdist; a user who sets glibc's malloc settings (``GLIBC_TUNABLES`` or a ``MALLOC_*_`` variable) keeps them,
and off glibc (macOS, Windows, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import sys

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_BYTES = 32 << 20  # blocks larger than this are mapped and unmapped (glibc's largest threshold)
TRIM_BYTES = 1 << 30  # free memory kept at the heap's top before it is handed back
USER_SETTINGS = (
    "GLIBC_TUNABLES",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_MMAP_MAX_",
    "MALLOC_TOP_PAD_",
)


@functools.cache
def keep_freed_memory() -> bool:
    """Keep freed blocks in this process's heap (see the module's docstring); True where glibc took the settings.
    Once per process; later calls return the first outcome."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    if any(name in os.environ for name in USER_SETTINGS):
        return False  # the user's own malloc settings win
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # Blocks up to MMAP_BYTES from the heap (so not unmapped when freed), and the heap trimmed only past TRIM_BYTES.
    return mallopt(M_MMAP_THRESHOLD, MMAP_BYTES) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_BYTES) == 1
