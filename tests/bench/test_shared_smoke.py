"""bench/shared.py at a tiny size: a structure check, not a timed test."""

from __future__ import annotations

import asyncio
import math

import pytest

from bench import shared
from tests.redis_server import RedisServerUnavailable, find_redis_server

pytestmark = pytest.mark.slow


def test_every_setup_is_timed_each_round_and_the_table_prints() -> None:
    """Each setup (one SQLite process, two workers on one file, one Redis process, two Redis
    replicas round robin) answered every request (a non-200 raises) and has one finite CPU
    ratio per round; the table has a row per setup."""
    try:
        find_redis_server()
    except RedisServerUnavailable as exc:  # (.ci/run installs it)
        pytest.skip(str(exc))
    costs = asyncio.run(shared.measure(20_000, requests=3, rounds=2))
    assert list(costs.ratios) == [name for name, _ in shared.SETUPS]
    for ratios in costs.ratios.values():
        assert len(ratios) == 2 and all(math.isfinite(r) and r > 0 for r in ratios)
    assert costs.relay_ms > 0
    table = shared.format_costs(costs)
    assert table.count("\n") == len(shared.SETUPS) + 1 and "round robin" in table
