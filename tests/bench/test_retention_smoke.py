"""bench/retention.py at a tiny size: a structure check, not a measurement."""

from __future__ import annotations

from bench import retention


def test_rows_count_what_the_views_keep() -> None:
    """A few corpus conversations and the synthetic sessions are compacted: every row counts
    user texts and artifacts at risk, never more kept than at risk, and prints one line."""
    named = retention.sessions(limit=3)
    assert sum(name.startswith("synthetic-") for name, _ in named) == 4
    rows = [retention.measure(named, f, "t") for f in (0.5, 0.2)]
    for row in rows:
        assert row.compacted >= 4 and row.texts > 0 and row.artifacts > 0
        assert row.texts_kept <= row.texts and row.artifacts_kept <= row.artifacts
        assert row.texts_in_budget_kept <= row.texts_in_budget <= row.texts
    table = retention.format_rows(rows)
    assert table.count("\n") == 2 and "%" in table
