"""``compact-proxy report``: summaries made ahead, and those no crossing used."""

from __future__ import annotations

from datetime import UTC, datetime

from proxy.accounting.report import build_report
from proxy.accounting.usage import PREPARED_ROW, PREPARED_USED_ROW, UsageEntry, UsageRow
from proxy.config.prices import DEFAULT_PRICES

NOW = datetime(2026, 12, 5, tzinfo=UTC)
MODEL = "claude-sonnet-4-5"


def _summary(calls: int, tokens: int) -> UsageEntry:
    return UsageEntry(summary_calls=calls, summary_cache_read_tokens=tokens - 100 * calls,
                      summary_output_tokens=100 * calls)


def test_unused_preparations_are_reported_with_their_tokens_and_paid_once() -> None:
    rows = [
        UsageRow("s1", MODEL, UsageEntry(requests=10, input_tokens=5_000), NOW),
        UsageRow("s1" + PREPARED_ROW, MODEL, _summary(3, 30_000), NOW),
        UsageRow("s1" + PREPARED_USED_ROW, MODEL, _summary(2, 21_000), NOW),
    ]
    report = build_report(rows, lambda model: DEFAULT_PRICES.get(model))
    assert [line.session_key for line in report.lines] == ["s1", "s1" + PREPARED_ROW]
    assert report.total.entry.summary_calls == 3  # each preparation paid once
    assert report.as_json()["prepared"] == {"calls": 3, "tokens": 30_000,
                                            "unused_calls": 1, "unused_tokens": 9_000}
    assert "never used: 1 calls, 9,000 tokens" in report.as_text()


def test_without_preparations_the_report_is_as_before() -> None:
    report = build_report([UsageRow("s1", MODEL, UsageEntry(requests=1), NOW)],
                          lambda model: DEFAULT_PRICES.get(model))
    assert "prepared" not in report.as_json()
    assert "made ahead" not in report.as_text()
