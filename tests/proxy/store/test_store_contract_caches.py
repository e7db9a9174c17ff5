"""The store contract on every backend: the summary and record caches, the usage ledger."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import UTC, datetime

import pytest

from proxy.accounting.usage import UsageEntry
from proxy.store import StoreBackend, UsageRow
from tests.proxy.store.helpers import StoreFactory, make_state

# --- caches -----------------------------------------------------------------------------


async def test_summary_round_trips_and_misses_are_none(store: StoreBackend) -> None:
    """A stored summary comes back by key (unicode intact); an unknown key gives None."""
    await store.put_summary("sha256:abc", "the user asked for a refactor — ünïcode 🙂")
    assert await store.get_summary("sha256:abc") == "the user asked for a refactor — ünïcode 🙂"
    assert await store.get_summary("sha256:other") is None


async def test_summary_cache_keeps_only_the_newest_entries(store_factory: StoreFactory) -> None:
    """Beyond max_summaries entries the oldest are evicted, the newest kept, nothing leaks."""
    small = await store_factory.open(max_summaries=5)
    try:
        for i in range(12):
            await small.put_summary(f"k{i}", f"summary {i}")
        kept = [i for i in range(12) if await small.get_summary(f"k{i}") is not None]
        assert kept == [7, 8, 9, 10, 11]
        counts = await store_factory.stored_summary_counts()
        assert set(counts) == {5}
    finally:
        await small.close()


async def test_summary_put_of_a_cached_key_keeps_the_first_text_and_age(
    store_factory: StoreFactory,
) -> None:
    """Content-addressed: a second put neither replaces the text nor makes the key younger."""
    small = await store_factory.open(max_summaries=2)
    try:
        await small.put_summary("k", "first")
        await small.put_summary("k2", "other")
        await small.put_summary("k", "second")
        assert await small.get_summary("k") == "first"
        await small.put_summary("k3", "newest")
        assert await small.get_summary("k") is None
        assert [await small.get_summary(k) for k in ("k2", "k3")] == ["other", "newest"]
    finally:
        await small.close()


async def test_concurrent_summary_puts_stay_within_the_bound(store_factory: StoreFactory) -> None:
    """50 concurrent puts of distinct keys leave exactly max_summaries entries."""
    small = await store_factory.open(max_summaries=10)
    try:
        await asyncio.gather(*(small.put_summary(f"k{i}", f"s{i}") for i in range(50)))
        counts = await store_factory.stored_summary_counts()
        assert set(counts) == {10}
    finally:
        await small.close()


async def test_records_round_trip_per_session_and_kind(store: StoreBackend) -> None:
    """Records are opaque bytes keyed by (session, kind); a put replaces the old bytes."""
    await store.put_record("s1", "l4-spans", b"\x00\x01binary\xff")
    await store.put_record("s1", "other", b"x")
    await store.put_record("s2", "l4-spans", b"y")
    await store.put_record("s1", "l4-spans", b"replaced\x00")
    assert await store.get_record("s1", "l4-spans") == b"replaced\x00"
    assert await store.get_record("s1", "other") == b"x"
    assert await store.get_record("s2", "l4-spans") == b"y"
    assert await store.get_record("s3", "l4-spans") is None
    assert await store.get_record("s1", "missing-kind") is None


async def test_caches_survive_a_state_delete(store: StoreBackend) -> None:
    """Deleting the durable state leaves the session's compaction records alone."""
    await store.put_state("s1", make_state(), None)
    await store.put_record("s1", "l4-spans", b"data")
    await store.delete_state("s1")
    assert await store.get_record("s1", "l4-spans") == b"data"


# --- the usage ledger -------------------------------------------------------------------


def usage(seed: int) -> UsageEntry:
    """An entry with every counter set, each to a different multiple of ``seed``."""
    return UsageEntry(*(seed * (index + 1) for index in range(len(UsageEntry.field_names()))))


async def test_usage_ledger_starts_empty(store: StoreBackend) -> None:
    """A fresh store has no usage rows."""
    assert await store.usage_rows() == []


async def test_adding_usage_twice_sums_every_counter(store: StoreBackend) -> None:
    """Two additions to one (session, model) give one row holding their sum."""
    before = datetime.now(UTC)
    await store.add_usage("demo-session", "claude-opus-4-5", usage(1))
    await store.add_usage("demo-session", "claude-opus-4-5", usage(10))
    after = datetime.now(UTC)
    rows = await store.usage_rows()
    assert len(rows) == 1
    row = rows[0]
    assert isinstance(row, UsageRow)
    assert (row.session_key, row.model, row.entry) == ("demo-session", "claude-opus-4-5",
                                                       usage(11))
    assert row.last_seen.tzinfo is not None
    assert before <= row.last_seen <= after


async def test_usage_rows_are_per_session_and_model(store: StoreBackend) -> None:
    """Rows are kept apart by session key and by model, and listed sorted by both; keys with
    separators or unicode come back exactly."""
    keys = ["t0123456789abcdef/sess-1", "sess-1", "a:b", "usage:row:x", "ü/ñ 🙂"]
    for index, key in enumerate(keys):
        await store.add_usage(key, "claude-sonnet-4-5", usage(index + 1))
    await store.add_usage("sess-1", "claude-haiku-4-5", UsageEntry(summary_calls=1,
                                                                   summary_input_tokens=900))
    rows = await store.usage_rows()
    got = {(row.session_key, row.model): row.entry for row in rows}
    assert got == {
        **{(key, "claude-sonnet-4-5"): usage(index + 1) for index, key in enumerate(keys)},
        ("sess-1", "claude-haiku-4-5"): UsageEntry(summary_calls=1, summary_input_tokens=900),
    }
    assert [(row.session_key, row.model) for row in rows] == sorted(got)


async def test_last_seen_is_the_time_of_the_last_addition(store: StoreBackend) -> None:
    """last_seen moves forward with each addition to the row."""
    await store.add_usage("s1", "m", usage(1))
    first = (await store.usage_rows())[0].last_seen
    await asyncio.sleep(0.01)
    await store.add_usage("s1", "m", UsageEntry())
    second = (await store.usage_rows())[0].last_seen
    assert second > first
    assert (await store.usage_rows())[0].entry == usage(1)


async def test_concurrent_usage_additions_sum_exactly(store_factory: StoreFactory) -> None:
    """50 concurrent additions through two store instances on the same data lose nothing."""
    a = await store_factory.open()
    b = await store_factory.open()
    try:
        await asyncio.gather(*((a if i % 2 else b).add_usage("s1", "m", usage(i + 1))
                               for i in range(50)))
        rows = await a.usage_rows()
        assert [(row.session_key, row.model) for row in rows] == [("s1", "m")]
        assert rows[0].entry == usage(sum(range(1, 51)))
        assert await b.usage_rows() == rows
    finally:
        await a.close()
        await b.close()


async def test_usage_persists_across_store_instances(store_factory: StoreFactory) -> None:
    """Rows written by one store are read, and added to, by a new one on the same data."""
    first = await store_factory.open()
    await first.add_usage("s1", "m", usage(2))
    await first.close()
    second = await store_factory.open()
    try:
        await second.add_usage("s1", "m", usage(3))
        assert [row.entry for row in await second.usage_rows()] == [usage(5)]
    finally:
        await second.close()


async def test_add_usage_refuses_anything_but_a_usage_entry(store: StoreBackend) -> None:
    """A wrong type is a TypeError and writes nothing; negative counters cannot be built."""
    with pytest.raises(TypeError):
        await store.add_usage("s1", "m", {"requests": 1})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="requests"):
        UsageEntry(requests=-1)
    assert await store.usage_rows() == []


async def test_data_from_before_the_usage_ledger_opens_and_gets_usage(
    store_factory: StoreFactory,
) -> None:
    """A store written by the version without the ledger (SQLite: no session_usage table)
    opens, keeps its state, and takes usage rows."""
    old = await store_factory.open()
    await old.put_state("s1", make_state("old"), None)
    await old.close()
    if store_factory.backend == "sqlite":
        conn = sqlite3.connect(store_factory.location)
        try:
            conn.execute("DROP TABLE session_usage")
            for table in ("audit_request", "audit_session", "audit_change", "record_version",
                          "store_lock", "state_tombstone"):
                conn.execute(f"DROP TABLE {table}")
            conn.commit()
            tables = {name for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
            assert tables == {"schema_version", "session_state", "summary_cache",
                              "session_record"}
        finally:
            conn.close()
    store = await store_factory.open()
    try:
        read = await store.get_state("s1")
        assert read is not None and read.state == make_state("old")
        assert await store.usage_rows() == []
        await store.add_usage("s1", "m", usage(1))
        assert [row.entry for row in await store.usage_rows()] == [usage(1)]
    finally:
        await store.close()
