"""bench/zero_wait.py with a few turns: a structure check, not a timed test."""

from __future__ import annotations

import asyncio

from bench import zero_wait


def test_the_rows_print_side_by_side_and_no_view_is_refused() -> None:
    """Inline and prepared sessions of 60 turns through a real proxy: both cross the soft
    threshold with a summary, the provider refuses nothing, and the table and goals print."""
    rows = asyncio.run(zero_wait.measure(60, 0.002, [0.8], None))
    inline, prepared = rows
    assert inline.name == "inline" and prepared.name == "prepared@0.8"
    for row in rows:
        assert row.turns == 60 and row.refused == 0 and row.client_errors == 0
        assert row.crossings >= 1 and row.summary_calls >= 1 and row.summary_tokens > 0
        assert 0 < row.cache_read_share < 1 and row.cost_usd > 0
        assert row.landings and 0 < row.summary_cost_usd < row.cost_usd and row.base_ms >= 0
    table = zero_wait.format_rows(rows)
    assert table.count("\n") == 3 and "prepared@0.8" in table
    assert len(zero_wait.goals(inline, prepared)) == 6
