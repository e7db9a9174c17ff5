"""The console's request-log pieces below the pages: the audit entry's new fields, the time
range and request-id filter, the trend's buckets, and the bounded scan over every session (real
SQLite and Redis stores). What a user sees is tested in the browser
(``test_console_log_browser``)."""

from __future__ import annotations

import functools
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from proxy.admin.console import _overview
from proxy.admin.console._range import request_filter
from proxy.admin.console._totals import request_cost
from proxy.admin.console._trend import trend
from proxy.audit.log import RequestEntry
from proxy.config.prices import DEFAULT_PRICES, price_for
from proxy.store import StoreBackend
from proxy.store.redis import RedisStateStore
from proxy.store.sqlite import SQLiteStateStore

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def entry(request_id: str, at: datetime, session_id: str = "s", **fields: object) -> RequestEntry:
    return RequestEntry(at=at, request_id=request_id, session_id=session_id, tenant="none",
                        route="messages", **fields)  # type: ignore[arg-type]


def test_the_new_fields_round_trip_and_older_entries_read_as_unknown() -> None:
    """Limits at the time, the summary key and a refusal's kind and id go through the JSON
    form; an entry written before they existed reads back with ``None``."""
    new = entry("r1", NOW, soft_threshold_tokens=24000, hard_limit_tokens=40000,
                summary_key="t1/abc", protocol_kind="missing", tool_use_id="toolu_1")
    assert RequestEntry.from_json(new.as_json()) == new
    old = {key: value for key, value in new.as_json().items()
           if key not in ("soft_threshold_tokens", "hard_limit_tokens", "summary_key",
                          "protocol_kind", "tool_use_id")}
    read = RequestEntry.from_json(old)
    assert (read.soft_threshold_tokens, read.hard_limit_tokens, read.summary_key,
            read.protocol_kind, read.tool_use_id) == (None,) * 5
    with pytest.raises(ValueError, match="^hard_limit_tokens: "):
        RequestEntry.from_json({**new.as_json(), "hard_limit_tokens": "40000"})


def test_the_filter_reads_presets_ends_and_a_request_id() -> None:
    """A preset sets ``since``; ``from``/``to`` win over it (a minute's ``to`` keeps that
    whole minute); an unreadable end is named and ignored; the id is matched in lower case."""
    day = request_filter({"range": "24h"}, now=NOW)
    assert day.since == NOW - timedelta(days=1) and day.until is None and day.active
    assert not request_filter({}, now=NOW).active  # all time
    assert request_filter({"range": "nonsense"}, default="7d", now=NOW).preset == "7d"
    ends = request_filter({"range": "1h", "from": "2026-12-05T09:00",
                           "to": "2026-12-05T10:30"}, now=NOW)
    assert ends.preset == "" and ends.since == datetime(2026, 12, 5, 9, 0, tzinfo=UTC)
    assert ends.keeps(entry("a", datetime(2026, 12, 5, 10, 30, 59, tzinfo=UTC)))
    assert not ends.keeps(entry("b", datetime(2026, 12, 5, 10, 31, tzinfo=UTC)))
    assert not ends.keeps(entry("c", datetime(2026, 12, 5, 8, 59, 59, tzinfo=UTC)))
    bad = request_filter({"from": "yesterday", "rid": " AB12 "}, now=NOW)
    assert bad.problem is not None and bad.problem.startswith("from: ")
    assert bad.since is None and bad.request_id == "ab12"
    assert bad.keeps(entry("00ab12ff", NOW)) and not bad.keeps(entry("00ab13ff", NOW))


def test_the_trend_puts_requests_in_hours_or_days_empty_ones_too() -> None:
    """Up to 48 hours: one bucket per hour of the range; longer: per day; each request in
    its own bucket, priced at its model's price."""
    prices = functools.partial(price_for, DEFAULT_PRICES)
    entries = [entry("r1", NOW - timedelta(hours=3), model="claude-sonnet-4-5",
                     tokens_before=1000, tokens_after=400, usage_input=1_000_000,
                     outcome="forwarded"),
               entry("r2", NOW - timedelta(minutes=5), outcome="invalid")]
    hourly = trend(entries, prices, since=NOW - timedelta(days=1), until=None,
                   now=NOW)
    assert hourly.unit == "hour" and len(hourly.buckets) == 25
    counted = {b.start: b.totals for b in hourly.buckets if b.totals.requests}
    assert counted[NOW - timedelta(hours=3)].saved == 600
    assert counted[NOW - timedelta(hours=3)].cost == pytest.approx(3.0)  # $3 per M input
    assert counted[NOW - timedelta(hours=1)].outcomes == {"invalid": 1}
    daily = trend(entries, prices, since=NOW - timedelta(days=7), until=None,
                  now=NOW)
    assert daily.unit == "day" and len(daily.buckets) == 8
    assert sum(b.totals.requests for b in daily.buckets) == 2
    assert request_cost(entries[1], prices) is None  # no usage, no model


@pytest.fixture(params=["sqlite", "redis"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StoreBackend]:
    """A real store of each backend (Redis with a key prefix of this test's own)."""
    opened: StoreBackend
    if request.param == "sqlite":
        opened = await SQLiteStateStore(tmp_path / "state.db", audit_linger_s=0.01).open()
    else:
        opened = await RedisStateStore(request.getfixturevalue("redis_url"),
                                       key_prefix=f"test-{uuid.uuid4().hex}:",
                                       audit_linger_s=0.01).open()
    try:
        yield opened
    finally:
        await opened.close()


async def test_the_scan_over_sessions_is_bounded_and_stops_before_the_range(
        store: StoreBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every session's requests in the range, newest first; sessions last seen before the
    range are not read; past the bound the scan stops and says so."""
    for index in range(5):  # session i last seen i hours ago, two requests each
        at = NOW - timedelta(hours=index)
        for offset in (timedelta(minutes=30), timedelta(0)):
            await store.add_request(entry(f"r{index}-{offset.seconds}", at - offset,
                                          session_id=f"s{index}"))
    await store.flush()
    found = await _overview.gather(store, request_filter({}, now=NOW))
    assert len(found.entries) == 10 and found.sessions == 5 and not found.cut
    assert [e.at for e in found.entries] == sorted((e.at for e in found.entries), reverse=True)
    recent = await _overview.gather(store, request_filter({"from": "2026-12-05T10:45"}))
    assert {e.request_id for e in recent.entries} == {"r0-0", "r0-1800", "r1-0"}
    assert recent.sessions == 2  # s2 (last seen 10:00) ended the scan
    monkeypatch.setattr(_overview, "SCAN_SESSIONS", 3)
    cut = await _overview.gather(store, request_filter({}, now=NOW))
    assert cut.cut and cut.sessions == 3 and {e.session_id for e in cut.entries} == {
        "s0", "s1", "s2"}
