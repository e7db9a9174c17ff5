"""bench/features.py at a tiny size: a structure check, not a timed test."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
import yaml

from bench import features
from bench.harness.config import SESSION_THRESHOLDS, write_proxy_config


@pytest.mark.slow
def test_every_variant_is_measured_against_the_relay_and_the_table_prints() -> None:
    """The relay and each variant served every request and used CPU; each variant's config
    says what it turned off; the table has a row per process."""
    costs = asyncio.run(features.measure(20_000, requests=4, pace_s=0.0))
    assert costs.requests == 4 and costs.body_bytes > 20_000
    assert costs.baseline_ms is None and costs.redis_ms is None  # (neither asked for)
    assert list(costs.variant_ms) == [name for name, _ in features.VARIANTS]
    assert math.isfinite(costs.relay_ms) and costs.relay_ms > 0
    for name, _ in features.VARIANTS:
        assert math.isfinite(costs.variant_ms[name]) and costs.variant_ms[name] > 0
        assert costs.ratio(name) == costs.variant_ms[name] / costs.relay_ms
    assert costs.saved("all on") == 0.0
    assert costs.pointers == features.DURABLE_FACTS + 1  # (the pending items share one)
    assert math.isfinite(costs.durable_ms) and costs.durable_ms > 0
    table = features.format_costs(costs, 0.0)
    assert table.count("\n") == len(features.VARIANTS) + 3
    assert "bare relay" in table and "proxy, all three off" in table
    assert f"proxy, durable state ({costs.pointers} pointers)" in table


def test_the_durable_state_is_seeded_and_every_pointer_verifies(tmp_path: Path) -> None:
    """The seeded state is in the proxy's store, and its pointers are all available in the
    proxy's roots (the cell measures verified sources, not refusals)."""
    from compactor import SourcePointerResolver, resolve_durable_sources
    from proxy.store import SQLiteStateStore

    pointers = asyncio.run(features.seed_durable_state(tmp_path, "bench-features"))

    async def read() -> object:
        store = await SQLiteStateStore(tmp_path / "state.db").open()
        try:
            return await store.get_state("bench-features")
        finally:
            await store.close()

    stored = asyncio.run(read())
    assert stored is not None
    state = stored.state  # type: ignore[attr-defined]
    assert len(state.facts) == features.DURABLE_FACTS
    assert len(state.pending_items) == features.DURABLE_PENDING
    resolver = SourcePointerResolver(tmp_path / "transcripts", tmp_path / "artifacts",
                                     lambda pointer: True)
    resolutions = resolve_durable_sources(state, resolver)
    assert len(resolutions) == pointers == features.DURABLE_FACTS + 1
    assert {r.status for r in resolutions} == {"available"}


def test_a_variant_changes_only_what_it_names(tmp_path: Path) -> None:
    """A config's overrides set the keys they name and keep every other key of the
    benchmark's config."""
    plain = yaml.safe_load(write_proxy_config(tmp_path / "a", "http://127.0.0.1:9",
                                              SESSION_THRESHOLDS, sticky=True, port=1)
                           .read_text(encoding="utf-8"))
    changed = yaml.safe_load(write_proxy_config(
        tmp_path / "b", "http://127.0.0.1:9", SESSION_THRESHOLDS, sticky=True, port=1,
        overrides=dict(features.VARIANTS)["all three off"]).read_text(encoding="utf-8"))
    assert changed["audit"] == {**plain["audit"], "enabled": False}
    assert changed["logging"] == {**plain["logging"], "level": "warning"}
    assert changed["compaction"] == {**plain["compaction"], "calibration": False}
    for section in ("listen", "upstream", "summary", "admin"):
        assert changed[section] == plain[section]


@pytest.mark.slow
def test_blocks_a_baseline_and_a_redis_store_are_measured_and_printed() -> None:
    """--block sends each process its requests in a row; --baseline runs a git ref's proxy
    (here the checked-out commit) next to the others, in its own row; --redis: one more
    process on a real Redis (and the baseline's), each row printed with what it costs. (One
    run for the three options: each starts every process again.)"""
    from tests.redis_server import RedisServer, RedisServerUnavailable
    from tests.servers import started

    with started(RedisServer(), RedisServerUnavailable) as server:
        costs = asyncio.run(features.measure(20_000, requests=4, pace_s=0.0, block=2,
                                             baseline="HEAD", redis=server.url))
    assert costs.baseline_ref == "HEAD"
    assert costs.baseline_ms is not None and math.isfinite(costs.baseline_ms)
    assert costs.baseline_ms > 0 and "baseline" not in costs.variant_ms
    assert costs.baseline_durable_ms is not None and costs.baseline_durable_ms > 0
    assert costs.redis_ms is not None and math.isfinite(costs.redis_ms) and costs.redis_ms > 0
    assert costs.baseline_redis_ms is not None and costs.baseline_redis_ms > 0
    table = features.format_costs(costs, 0.0, 2)
    assert "blocks of 2" in table and "baseline HEAD, all on" in table
    assert "baseline HEAD, durable state" in table
    assert "proxy, Redis store" in table and "baseline HEAD, Redis store" in table
    assert table.count("\n") == len(features.VARIANTS) + 7
    with pytest.raises(ValueError, match="--block"):
        asyncio.run(features.measure(20_000, requests=5, pace_s=0.0, block=2))
