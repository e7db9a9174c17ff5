"""bench/features.py at a tiny size: a structure check, not a timed test."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
import yaml

from bench import features
from bench.proxy import SESSION_THRESHOLDS, write_proxy_config


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


def test_blocks_and_a_baseline_are_measured_and_printed() -> None:
    """--block sends each process its requests in a row; --baseline runs a git ref's proxy
    (here the checked-out commit) next to the others, in its own row."""
    costs = asyncio.run(features.measure(20_000, requests=4, pace_s=0.0, block=2,
                                         baseline="HEAD"))
    assert costs.baseline_ref == "HEAD"
    assert costs.baseline_ms is not None and math.isfinite(costs.baseline_ms)
    assert costs.baseline_ms > 0 and "baseline" not in costs.variant_ms
    table = features.format_costs(costs, 0.0, 2)
    assert "blocks of 2" in table and "baseline HEAD, all on" in table
    assert table.count("\n") == len(features.VARIANTS) + 3
    with pytest.raises(ValueError, match="--block"):
        asyncio.run(features.measure(20_000, requests=5, pace_s=0.0, block=2))
