"""Smoke test of ``bench/hostile_conns.py``: a tiny run against real ``serve`` processes reports
well-formed figures (no timing asserted beyond what the tiny config makes certain)."""

from __future__ import annotations

import argparse
import asyncio

import bench.hostile_conns as hostile


def test_a_tiny_run_reports_both_phases() -> None:
    """Three streams (the pool far from full: the next caller waits for its read timeout),
    twenty slow connections under a soft limit of 256 files, two seconds of probes."""
    args = argparse.Namespace(streams=3, slow=20, nofile=256, hold_s=2.0, read_timeout_s=1.0,
                              source=None)
    result = asyncio.run(hostile.run(args))
    pool, slow = result["pool"], result["slowloris"]
    assert pool["streams_held"] == 3
    assert (pool["next_status"], pool["next_error"]) == (504, "api_error")
    assert 1.0 <= pool["next_wait_s"] < 5.0
    assert slow["slow_connections"] == 20 and slow["failed_to_open"] == 0
    assert sum(slow["healthz_statuses"].values()) >= 2
    assert slow["healthz_statuses"].get("200", 0) >= 2  # few connections: never refused
    assert len(slow["healthz_timeline"].split()) == sum(slow["healthz_statuses"].values())
