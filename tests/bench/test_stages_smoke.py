"""bench/stages.py at a tiny size: a structure check, not a timed test."""

from __future__ import annotations

import asyncio
import math

import pytest

from bench import stages

pytestmark = pytest.mark.slow


def test_every_stage_is_timed_once_per_request_and_the_table_prints() -> None:
    """Each stage of a warm request ran once per request (the facts and the checkpoint
    read inside the compaction, the learning inside the relay), took thread time, and the
    table has a row per stage and a column per size."""
    results = asyncio.run(stages.measure([20_000, 60_000], requests=6, pace_s=0.0))
    assert [r.requests for r in results] == [6, 6]
    for result in results:
        assert math.isfinite(result.cpu_ms) and result.cpu_ms > 0
        assert set(result.stages) == {name for _, name in stages.STAGES}
        for name in ("parse_request", "plan_compaction", "_compact", "compact_context_async",
                     "_send", "_relay", "_learn", "_keep_in_audit_log", "RequestBody.facts"):
            ms, calls = result.stages[name]
            assert calls == 1.0, name
            assert ms >= 0.0
        assert result.stages["_compact"][0] >= result.stages["compact_context_async"][0]
    table = stages.format_results(results, 0.0)
    assert table.count("\n") == len(stages.STAGES) + 3
    assert "no stage" in table and "MB" in table


def test_the_same_request_every_time_sends_one_body() -> None:
    """--same: every timed request is one body (the CPU cell's), each stage still timed once
    per request."""
    result, = asyncio.run(stages.measure([20_000], requests=4, pace_s=0.0, same=True))
    grown, = asyncio.run(stages.measure([20_000], requests=4, pace_s=0.0))
    assert result.requests == 4 and result.stages["_compact"][1] == 1.0
    assert result.body_bytes < grown.body_bytes  # (grown by three more exchanges)
