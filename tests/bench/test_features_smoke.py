"""bench/features.py at a tiny size: a structure check, not a timed test."""

from __future__ import annotations

import asyncio
import math

from bench import features


def test_every_variant_is_measured_against_the_relay_and_the_table_prints() -> None:
    """The relay and each variant served every request and used CPU; each variant's config
    says what it turned off; the table has a row per process."""
    costs = asyncio.run(features.measure(20_000, requests=4, pace_s=0.0))
    assert costs.requests == 4 and costs.body_bytes > 20_000
    assert list(costs.variant_ms) == [name for name, _ in features.VARIANTS]
    assert math.isfinite(costs.relay_ms) and costs.relay_ms > 0
    for name, _ in features.VARIANTS:
        assert math.isfinite(costs.variant_ms[name]) and costs.variant_ms[name] > 0
        assert costs.ratio(name) == costs.variant_ms[name] / costs.relay_ms
    assert costs.saved("all on") == 0.0
    table = features.format_costs(costs, 0.0)
    assert table.count("\n") == len(features.VARIANTS) + 2
    assert "bare relay" in table and "proxy, all three off" in table


def test_a_variant_changes_only_what_it_names() -> None:
    """The config merge keeps every other key of the benchmark's config."""
    base = {"audit": {"enabled": True, "retention_days": 7}, "logging": {"level": "info"}}
    merged = features._merged(base, {"audit": {"enabled": False}})
    assert merged == {"audit": {"enabled": False, "retention_days": 7},
                      "logging": {"level": "info"}}
    assert base["audit"]["enabled"] is True  # (the base is not changed)
