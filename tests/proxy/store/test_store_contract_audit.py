"""The store contract on every backend: the audit log (requests, sessions, changes, bounds)."""

from __future__ import annotations

import asyncio
import importlib
import pkgutil
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from proxy.audit.log import RequestEntry, SessionSummary, StateChange
from proxy.store import RedisStateStore, SQLiteStateStore, StoreBackend
from tests.proxy.store.helpers import NOW, StoreFactory, entry


def summary_of(entries: list[RequestEntry]) -> SessionSummary:
    """What the store should say of a session holding ``entries``."""
    return SessionSummary(
        session_id=entries[0].session_id, tenant=entries[0].tenant,
        last_seen=max(e.at for e in entries), requests=len(entries),
        tokens_before=sum(e.tokens_before or 0 for e in entries),
        tokens_after=sum(e.tokens_after or 0 for e in entries),
        blocked=sum(e.blocked for e in entries))


async def test_audit_log_starts_empty(store: StoreBackend) -> None:
    """A fresh store has no sessions, requests, changes or blocked requests."""
    assert await store.sessions() == ([], 0)
    assert await store.session_requests("none", "sess-1") == ([], 0)
    assert await store.state_changes("none", "sess-1") == []
    assert await store.blocked_since(NOW - timedelta(days=1)) == []


async def test_request_entries_round_trip_newest_first(store: StoreBackend) -> None:
    """Every field comes back as written; a session's requests are newest first."""
    written = [entry(1), entry(2, blocked=True), entry(3)]
    for item in written:
        await store.add_request(item)
    assert await store.session_requests("none", "sess-1") == (written[::-1], 3)


async def test_request_pages_are_offset_and_limit_with_the_total(store: StoreBackend) -> None:
    """offset / limit cut the newest-first list; the total counts them all."""
    written = [entry(i) for i in range(7)]
    for item in written:
        await store.add_request(item)
    newest_first = written[::-1]
    assert await store.session_requests("none", "sess-1", limit=3) == (newest_first[:3], 7)
    assert await store.session_requests("none", "sess-1", offset=3, limit=3) == (
        newest_first[3:6], 7)
    assert await store.session_requests("none", "sess-1", offset=6, limit=3) == (
        newest_first[6:], 7)
    assert await store.session_requests("none", "sess-1", offset=9) == ([], 7)


async def test_session_totals_add_up_the_entries(store: StoreBackend) -> None:
    """A session's summary: its newest time, how many requests, their token sums, how many
    were refused."""
    written = [entry(1), entry(2, blocked=True), entry(3), entry(4, blocked=True)]
    for item in written:
        await store.add_request(item)
    summaries, total = await store.sessions()
    assert (summaries, total) == ([summary_of(written)], 1)
    assert summaries[0].saved_ratio == pytest.approx(1 - sum(e.tokens_after or 0 for e in written)
                                                     / sum(e.tokens_before or 0 for e in written))


async def test_entries_beyond_the_per_session_bound_go_oldest_first(
    store_factory: StoreFactory,
) -> None:
    """max_requests_per_session 3: the session keeps its newest three; its totals and the
    blocked index follow, and other sessions keep theirs."""
    store = await store_factory.open(max_requests_per_session=3)
    try:
        written = [entry(1, blocked=True), entry(2), entry(3), entry(4), entry(5, blocked=True)]
        for item in written:
            await store.add_request(item)
        await store.add_request(entry(1, session="other"))
        assert await store.session_requests("none", "sess-1") == (written[:1:-1], 3)
        summaries, _ = await store.sessions()
        assert summary_of(written[2:]) in summaries
        assert summary_of([entry(1, session="other")]) in summaries
        assert await store.blocked_since(NOW - timedelta(days=1)) == [written[4]]
    finally:
        await store.close()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[datetime]:
    """The stores' clock (what "now" is for the retention), set by the test: ``clock[0]``."""
    now = [NOW]
    for package in ("proxy.store.sqlite", "proxy.store.redis"):
        for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
            module = importlib.import_module(f"{package}.{info.name}")
            if hasattr(module, "utc_now"):  # (each module of the backend that reads the clock)
                monkeypatch.setattr(module, "utc_now", lambda: now[0])
    return now


async def test_entries_older_than_the_retention_go_when_their_session_is_written(
    store_factory: StoreFactory, clock: list[datetime],
) -> None:
    """retention_days 2: three days on, a session's next write drops its old entries (and
    their refusals from the blocked list); another session's old entries wait for trim()."""
    store = await store_factory.open(retention_days=2)
    try:
        old = entry(1, blocked=True)
        elsewhere = entry(2, session="other")
        await store.add_request(old)
        await store.add_request(elsewhere)
        clock[0] = NOW + timedelta(days=3)
        recent = entry(3, at=NOW + timedelta(days=3))
        await store.add_request(recent)
        assert await store.session_requests("none", "sess-1") == ([recent], 1)
        assert await store.blocked_since(NOW - timedelta(days=10)) == []
        assert await store.sessions() == ([summary_of([recent]), summary_of([elsewhere])], 2)
        assert await store.trim(clock[0]) == 1
        assert await store.sessions() == ([summary_of([recent])], 1)
    finally:
        await store.close()


async def test_trim_drops_what_the_retention_no_longer_allows(
    store_factory: StoreFactory,
) -> None:
    """trim(now) drops every entry and change older than now - retention_days, says how
    many, and keeps the rest."""
    store = await store_factory.open(retention_days=1)
    try:
        for index in range(3):
            await store.add_request(entry(index, session=f"s{index}"))
        await store.add_state_change(change(1))
        assert await store.trim(NOW) == 0
        # A day after a time between entry 1 (and the change) and entry 2.
        later = NOW - timedelta(hours=1) + timedelta(seconds=1.5) + timedelta(days=1)
        assert await store.trim(later) == 3  # entries 0 and 1, and the change
        summaries, total = await store.sessions()
        assert total == 1 and [s.session_id for s in summaries] == ["s2"]
        assert await store.state_changes("none", "sess-1") == []
        assert await store.trim(later) == 0
    finally:
        await store.close()


async def test_entries_added_together_are_kept_as_one_by_one(
    store_factory: StoreFactory,
) -> None:
    """Entries added without waiting go in one batch (one future for all; per session, one
    write): the sessions, their pages, totals and refusals are those of one-by-one adds; a
    session over its bound keeps its newest, and a refusal the bound dropped is not listed."""
    store = await store_factory.open(max_requests_per_session=3)
    try:
        added = [entry(index, session=("a", "b", "c")[index % 3], blocked=index in (0, 4, 7))
                 for index in range(12)]
        futures = [store.add_request(item) for item in added]
        assert all(future is futures[0] for future in futures)
        await asyncio.gather(*futures)
        for name in ("a", "b", "c"):
            kept = [e for e in added if e.session_id == name][-3:]
            assert await store.session_requests("none", name) == (kept[::-1], 3)
        summaries, total = await store.sessions()
        assert total == 3
        assert summaries == [summary_of([e for e in added if e.session_id == name][-3:])
                             for name in ("c", "b", "a")]
        assert await store.blocked_since(NOW - timedelta(days=1)) == [added[4], added[7]]
    finally:
        await store.close()


async def test_sessions_are_newest_first_or_most_blocked_first(store: StoreBackend) -> None:
    """order last_seen: newest first; order blocked: most refusals first, then newest."""
    await store.add_request(entry(1, session="a", blocked=True))
    await store.add_request(entry(2, session="a", blocked=True))
    await store.add_request(entry(3, session="b"))
    await store.add_request(entry(4, session="c", blocked=True))
    await store.add_request(entry(5, session="d"))
    by_time, total = await store.sessions()
    assert [s.session_id for s in by_time] == ["d", "c", "b", "a"] and total == 4
    by_blocked, _ = await store.sessions(order="blocked")
    assert [(s.session_id, s.blocked) for s in by_blocked] == [("a", 2), ("c", 1), ("d", 0),
                                                               ("b", 0)]


@pytest.mark.parametrize("order", ["last_seen", "blocked"])
async def test_session_pages_filters_and_totals(store: StoreBackend, order: str) -> None:
    """contains (any case) and tenant filter before paging; the total counts the matches."""
    names = ["build-1", "BUILD-2", "deploy-1", "build-3", "test-1"]
    for index, name in enumerate(names):
        await store.add_request(entry(index, session=name,
                                      tenant="t0123456789abcdef" if name == "build-3" else "none"))
    page, total = await store.sessions(contains="build", order=order)  # type: ignore[arg-type]
    assert total == 3 and [s.session_id for s in page] == ["build-3", "BUILD-2", "build-1"]
    page, total = await store.sessions(contains="Build", offset=1, limit=1,
                                       order=order)  # type: ignore[arg-type]
    assert total == 3 and [s.session_id for s in page] == ["BUILD-2"]
    page, total = await store.sessions(tenant="t0123456789abcdef")
    assert total == 1 and [(s.tenant, s.session_id) for s in page] == [
        ("t0123456789abcdef", "build-3")]
    page, total = await store.sessions(offset=2, limit=2, order=order)  # type: ignore[arg-type]
    assert total == 5 and [s.session_id for s in page] == ["deploy-1", "BUILD-2"]
    assert await store.sessions(contains="nothing-like-it") == ([], 0)


async def test_the_same_session_id_under_two_tenants_is_two_sessions(
    store: StoreBackend,
) -> None:
    """Entries are kept per (tenant, session id)."""
    await store.add_request(entry(1, tenant="none"))
    await store.add_request(entry(2, tenant="h0123456789abcdef"))
    assert await store.session_requests("none", "sess-1") == ([entry(1)], 1)
    assert await store.session_requests("h0123456789abcdef", "sess-1") == (
        [entry(2, tenant="h0123456789abcdef")], 1)
    assert (await store.sessions())[1] == 2


async def test_blocked_since_lists_refusals_oldest_first_from_that_time(
    store: StoreBackend,
) -> None:
    """Only refused requests, at or after ``since``, oldest first, across sessions, up to
    ``limit``."""
    written = [entry(1, blocked=True), entry(2), entry(3, session="b", blocked=True),
               entry(4, blocked=True)]
    for item in reversed(written):
        await store.add_request(item)
    since = written[2].at
    assert await store.blocked_since(since) == [written[2], written[3]]
    assert await store.blocked_since(since - timedelta(hours=1)) == [written[0], written[2],
                                                                      written[3]]
    assert await store.blocked_since(since - timedelta(hours=1), limit=1) == [written[0]]


def change(index: int, *, session: str = "sess-1", at: datetime | None = None) -> StateChange:
    """State change ``index`` of a session, ``index`` seconds after NOW - 1 h."""
    return StateChange(at=at or NOW - timedelta(hours=1) + timedelta(seconds=index),
                       session_id=session, tenant="none", actor=f"admin-api:op{index}",
                       action="delete" if index % 2 else "put",
                       version=None if index % 2 else index,
                       detail=(f"fact f{index} added", "pending p1: open -> done"))


async def test_state_changes_round_trip_newest_first_within_the_bounds(
    store_factory: StoreFactory,
) -> None:
    """Changes come back as written, newest first, per session; a session keeps at most
    max_requests_per_session of them and none older than the retention."""
    store = await store_factory.open(max_requests_per_session=3, retention_days=2)
    try:
        await store.add_state_change(change(0, at=NOW - timedelta(days=3)))
        for index in range(1, 6):
            await store.add_state_change(change(index))
        await store.add_state_change(change(9, session="other"))
        assert await store.state_changes("none", "sess-1") == [change(5), change(4), change(3)]
        assert await store.state_changes("none", "sess-1", limit=1) == [change(5)]
        assert await store.state_changes("none", "other") == [change(9, session="other")]
    finally:
        await store.close()


async def test_audit_log_persists_across_store_instances(store_factory: StoreFactory) -> None:
    """A new instance on the same data reads the entries, totals and changes written."""
    first = await store_factory.open()
    await first.add_request(entry(1, blocked=True))
    await first.add_state_change(change(2))
    await first.close()
    second = await store_factory.open()
    try:
        assert await second.session_requests("none", "sess-1") == ([entry(1, blocked=True)], 1)
        assert await second.sessions() == ([summary_of([entry(1, blocked=True)])], 1)
        assert await second.state_changes("none", "sess-1") == [change(2)]
    finally:
        await second.close()


async def test_concurrent_audit_writes_keep_exact_totals(store_factory: StoreFactory) -> None:
    """Two instances writing one session's entries at once: every entry counted once."""
    a, b = await store_factory.open(), await store_factory.open()
    try:
        written = [entry(i, blocked=i % 4 == 0) for i in range(40)]
        await asyncio.gather(*((a if i % 2 else b).add_request(item)
                               for i, item in enumerate(written)))
        assert await a.sessions() == ([summary_of(written)], 1)
        assert (await b.session_requests("none", "sess-1", limit=100))[1] == 40
    finally:
        await a.close()
        await b.close()


@pytest.mark.parametrize(
    ("call", "message"),
    [(lambda s: s.sessions(offset=-1), "offset"), (lambda s: s.sessions(limit=0), "limit"),
     (lambda s: s.sessions(order="size"), "order"),
     (lambda s: s.session_requests("none", "s", limit=True), "limit"),
     (lambda s: s.state_changes("none", "s", limit=0), "limit"),
     (lambda s: s.blocked_since(NOW, limit=-5), "limit")],
)
async def test_bad_pages_are_refused(store: StoreBackend, call: Any, message: str) -> None:
    """A negative offset, a limit below 1 or an unknown order is a ValueError naming it."""
    with pytest.raises(ValueError, match=message):
        await call(store)


async def test_audit_writes_refuse_other_types(store: StoreBackend) -> None:
    """add_request takes a RequestEntry, add_state_change a StateChange."""
    with pytest.raises(TypeError):
        await store.add_request(entry(1).as_json())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await store.add_state_change(entry(1))  # type: ignore[arg-type]
    assert await store.sessions() == ([], 0)


@pytest.mark.parametrize("bounds", [{"max_requests_per_session": 0}, {"retention_days": 0}])
def test_audit_bounds_below_one_are_refused(tmp_path: Path, bounds: dict[str, int]) -> None:
    """Both backends refuse a bound below 1 at construction."""
    with pytest.raises(ValueError, match=next(iter(bounds))):
        SQLiteStateStore(tmp_path / "s.db", **bounds)
    with pytest.raises(ValueError, match=next(iter(bounds))):
        RedisStateStore("redis://127.0.0.1:1/0", **bounds)
