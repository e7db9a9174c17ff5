"""Fixed thresholds for the C allocator of a process that holds whole request bodies.

glibc's mmap and trim thresholds move with what the process happens to free first, so a proxy
that frees large bodies can settle where every large request maps fresh pages again; fixing
them once at startup removes that lottery, at the cost of up to :data:`TRIM_THRESHOLD` free
bytes kept (docs/performance.md). Nothing changes off glibc, or when the operator set either
threshold (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``).
"""

from __future__ import annotations

import ctypes
import os
import platform
from typing import Any, Final

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "give_back_memory", "tune_allocator"]

#: Blocks smaller than this come from the heap (glibc's largest allowed value on 64-bit).
MMAP_THRESHOLD: Final = 32 * 1024 * 1024
#: Free memory at the top of the heap is given back only beyond this (glibc's own rule
#: when it raises the thresholds itself: twice the mmap threshold).
TRIM_THRESHOLD: Final = 2 * MMAP_THRESHOLD

_M_TRIM_THRESHOLD: Final = -1  # glibc's malloc.h
_M_MMAP_THRESHOLD: Final = -3
_OPERATOR_SETTINGS: Final = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


#: The C library when it is glibc (``None`` elsewhere: nothing is tuned or trimmed).
_GLIBC: Final[Any] = ctypes.CDLL(None) if platform.libc_ver()[0] == "glibc" else None
if _GLIBC is not None:
    _GLIBC.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    _GLIBC.mallopt.restype = ctypes.c_int
    _GLIBC.malloc_trim.argtypes = (ctypes.c_size_t,)
    _GLIBC.malloc_trim.restype = ctypes.c_int


def tune_allocator() -> str:
    """Fix glibc's mmap and trim thresholds for this process (once, at startup); returns the
    startup line's ``allocator``: ``fixed``, ``operator``, ``not_glibc`` or ``refused``."""
    if any(name in os.environ for name in _OPERATOR_SETTINGS):
        return "operator"
    if _GLIBC is None:
        return "not_glibc"
    # mallopt returns 1 on success, 0 on a value it does not take.
    if (_GLIBC.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1
            or _GLIBC.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1):
        return "refused"
    return "fixed"


def give_back_memory() -> None:
    """Return the free memory of every glibc arena to the kernel (``malloc_trim``): after a
    large body that was refused, so a hostile caller's garbage does not stay resident in
    the heap of each thread that touched it. Nothing where the C library is not glibc."""
    if _GLIBC is not None:
        _GLIBC.malloc_trim(0)
