"""Smoke test of ``bench/hostile.py``: a tiny run against real ``serve`` processes reports
both parts, well formed (no timing asserted)."""

from __future__ import annotations

import argparse
import asyncio

import pytest

import bench.hostile as hostile

pytestmark = pytest.mark.slow


def test_a_tiny_run_reports_memory_and_loop_lag() -> None:
    args = argparse.Namespace(tiny=True, bodies=None, blocks=None, concurrency=None,
                              cache_mib=64, baseline=None)
    report = asyncio.run(hostile.main_async(args))
    lines = report.splitlines()
    assert lines[0].startswith("hostile bodies with limits.decoded_cache_bytes = 64 MiB")
    memory = next(line for line in lines if line.startswith("this tree") and "MB" in line)
    assert '"200": 4' in memory  # the tiny bodies are under the thresholds: all answered
    lag = [line for line in lines if line.startswith("this tree") and "ms" in line]
    assert len(lag) == 1 and lag[0].split()[-1].endswith("s")
