"""Numbers from a run.

Percentiles and distributions; what a process or the machine spent (CPU from
``/proc/<pid>/stat`` and ``schedstat``, RSS from ``/proc/<pid>/status``, machine ticks from
``/proc/stat``, a process's children); the cells of the printed tables.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100) with linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Dist:
    """A distribution of milliseconds: count, p50, p99, mean, max."""

    n: int
    p50: float
    p99: float
    mean: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Dist:
        """The distribution of ``values``."""
        if not values:
            return cls(0, math.nan, math.nan, math.nan, math.nan)
        return cls(len(values), percentile(values, 50), percentile(values, 99),
                   sum(values) / len(values), max(values))


# -- part 1: added latency ----------------------------------------------------------------------



CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    # After the command name: state is field 3, utime 14 and stime 15 (1-based, proc(5)).
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _schedstat_ns(pid: int) -> int | None:
    """Nanoseconds on a CPU of every live thread of ``pid`` (``/proc/<pid>/task/*/schedstat``);
    None where the kernel does not keep it."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat", encoding="ascii") as stat:
                total += int(stat.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that just ended
    return total


def process_cpu_ns(pid: int) -> float:
    """CPU nanoseconds of ``pid`` so far, as precise as the kernel says it.

    The sum of its threads' ``schedstat`` (nanoseconds) where it is kept, but never less than
    ``/proc/<pid>/stat``'s utime + stime (clock ticks, which also count threads that ended):
    a cell of a few dozen requests is a few ticks, too coarse alone. NaN if the process is gone.
    """
    ticks = _stat_cpu_s(pid) * 1e9
    precise = _schedstat_ns(pid)
    if precise is None:
        return ticks
    return max(float(precise), ticks - 1e9 / CLOCK_TICKS)


async def signalled_json(pid: int, out: Path, *, timeout_s: float = 10.0) -> Any:
    """Send SIGUSR1 to ``pid`` and return the JSON it writes to ``out`` in answer (the
    instrumented processes of ``bench/stages.py`` and ``bench/steps.py``)."""
    out.unlink(missing_ok=True)
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + timeout_s
    while not (out.exists() and out.stat().st_size) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return json.loads(out.read_text(encoding="utf-8"))


def process_cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of ``pid`` so far (this process when None; NaN if gone)."""
    if pid is None:
        times = os.times()
        return times.user + times.system
    return process_cpu_ns(pid) / 1e9


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (Linux ``/proc``; none elsewhere)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text(encoding="ascii")
    except OSError:
        return []
    return [int(child) for child in text.split()]


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and its children so far (a supervisor and its workers)."""
    return sum(process_cpu_s(p) for p in (pid, *children(pid)))



def read_proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of ``pid`` in kB (empty when the process is gone)."""
    values: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key, value = line.split(":", 1)
                    values[key] = int(value.split()[0])
    except OSError:
        pass
    return values



def machine_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine so far (``/proc/stat``; zeros elsewhere)."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user
    return total - idle, total


# -- table cells ------------------------------------------------------------------------------


def fmt_ms(value: float) -> str:
    """Milliseconds in a 7-wide column (``-`` for NaN)."""
    return "    -" if math.isnan(value) else f"{value:7.2f}"


def safe_ratio(numerator: float, denominator: float) -> float:
    """``numerator / denominator``; NaN when the denominator is not positive."""
    return numerator / denominator if denominator and denominator > 0 else math.nan


def fmt_times(ratio: float) -> str:
    """A ratio with two decimals (``-`` for NaN)."""
    return "-" if math.isnan(ratio) else f"{ratio:.2f}"


def fmt_kb(size: int) -> str:
    """A body size as ``50 KB`` or ``2.6 MB``."""
    return f"{size / 1e6:.1f} MB" if size >= 1_000_000 else f"{size // 1000} KB"
