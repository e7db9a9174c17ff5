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


def tune_allocator() -> str:
    """Fix glibc's mmap and trim thresholds for this process (once, at startup); returns the
    startup line's ``allocator``: ``fixed``, ``operator``, ``not_glibc`` or ``refused``."""
    if any(name in os.environ for name in _OPERATOR_SETTINGS):
        return "operator"
    if platform.libc_ver()[0] != "glibc":
        return "not_glibc"
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # pragma: no cover - glibc always has mallopt
        return "not_glibc"
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success, 0 on a value it does not take.
    if mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1:
        return "refused"
    if mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1:  # pragma: no cover - any value is taken
        return "refused"
    return "fixed"


def _malloc_trim() -> Any:
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # pragma: no cover - glibc always has malloc_trim
        return None
    trim.argtypes = (ctypes.c_size_t,)
    trim.restype = ctypes.c_int
    return trim


_TRIM: Final = _malloc_trim()


def give_back_memory() -> None:
    """Return the free memory of every glibc arena to the kernel (``malloc_trim``): after a
    large body that was refused, so a hostile caller's garbage does not stay resident in
    the heap of each thread that touched it. Nothing where the C library is not glibc."""
    if _TRIM is not None:
        _TRIM(0)
