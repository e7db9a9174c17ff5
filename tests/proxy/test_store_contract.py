"""The store contract (every part of StoreBackend), run against every backend (SQLite on a
real file, Redis on a real ``redis-server``): versioned CAS writes, races between tasks and
between processes, persistence, several instances on one store, the compaction caches, the
usage ledger and closing."""

from __future__ import annotations

import asyncio
import multiprocessing
import sqlite3
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from compactor import DurableContextState, DurableFact, PendingItem, RetrievalEvidence
from proxy.state.store import (
    RecordStore,
    RedisStateStore,
    SQLiteStateStore,
    StateStore,
    StoreBackend,
    StoreError,
    SummaryCache,
    UsageLedger,
    UsageRow,
    VersionConflict,
)
from proxy.state.usage import UsageEntry

WHEN = datetime(2025, 3, 1, 12, 30, tzinfo=UTC)
BACKENDS = ["sqlite", "redis"]


def make_state(tag: str = "a", facts: int = 1) -> DurableContextState:
    """A state with every kind of item; ``tag`` makes contents distinct."""
    return DurableContextState(
        facts=tuple(
            DurableFact(f"fact-{tag}-{i}", f"the build for {tag} uses tox ({i})",
                        f"transcript:sess-1:{i + 1}", WHEN)
            for i in range(facts)
        ),
        pending_items=(
            PendingItem(f"todo-{tag}", f"rerun the flaky test ({tag})", "transcript:sess-1:9",
                        WHEN.astimezone(timezone(timedelta(hours=2)))),
        ),
        retrieval_evidence=(
            RetrievalEvidence(f"mem-{tag}", "artifact:sess-1:notes.md:" + "ab" * 6, "doc",
                              "Notes", WHEN, 0.75, 1, conflict_key="build-tool"),
        ),
    )


def unique_prefix() -> str:
    """A Redis key prefix no other test uses, so tests sharing the server never see each other."""
    return f"test-{uuid.uuid4().hex}:"


@dataclass(frozen=True)
class StoreFactory:
    """Where one test's store lives (a SQLite file, or a Redis URL plus a key prefix of its
    own); picklable, so a child process can open its own store on the same data."""

    backend: str
    location: str
    key_prefix: str = ""

    async def open(self, *, max_summaries: int = 1000) -> StoreBackend:
        """A new store instance on this test's data."""
        if self.backend == "sqlite":
            return await SQLiteStateStore(self.location, max_summaries=max_summaries).open()
        return await RedisStateStore(self.location, max_summaries=max_summaries,
                                     key_prefix=self.key_prefix).open()

    async def stored_summary_counts(self) -> tuple[int, ...]:
        """How many entries each of the backend's summary-cache structures holds, read raw."""
        if self.backend == "sqlite":
            conn = sqlite3.connect(self.location)
            try:
                return (conn.execute("SELECT COUNT(*) FROM summary_cache").fetchone()[0],)
            finally:
                conn.close()
        # The text hash and the age index must agree, or entries leak.
        client = aioredis.Redis.from_url(self.location)
        try:
            return (await client.hlen(f"{self.key_prefix}summary:text"),
                    await client.zcard(f"{self.key_prefix}summary:order"))
        finally:
            await client.aclose()


@pytest.fixture(params=BACKENDS)
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    """This test's store location on each backend; Redis is started only when asked for."""
    if request.param == "sqlite":
        return StoreFactory("sqlite", str(tmp_path / "state.db"))
    redis_url: str = request.getfixturevalue("redis_url")
    return StoreFactory("redis", redis_url, unique_prefix())


@pytest.fixture
async def store(store_factory: StoreFactory) -> AsyncIterator[StoreBackend]:
    """An opened store on this test's fresh data, closed after the test."""
    opened = await store_factory.open()
    yield opened
    await opened.close()


# --- basic CAS semantics ----------------------------------------------------------------


async def test_store_implements_the_state_store_protocol(store: StoreBackend) -> None:
    """The backend is usable wherever a StateStore (or another part of the store) is expected."""
    assert isinstance(store, StateStore)
    for part in (SummaryCache, RecordStore, UsageLedger, StoreBackend):
        assert isinstance(store, part)


async def test_first_put_creates_version_one_that_get_returns(store: StoreBackend) -> None:
    """Creating a state yields version 1, and get returns the same state and version."""
    assert await store.get_state("s1") is None
    written = await store.put_state("s1", make_state(), expected_version=None)
    assert (written.session_id, written.version) == ("s1", 1)
    assert written.updated_at.tzinfo is not None
    read = await store.get_state("s1")
    assert read is not None
    assert (read.version, read.state, read.updated_at) == (1, make_state(), written.updated_at)


async def test_put_with_current_version_replaces_and_increments(store: StoreBackend) -> None:
    """A write naming the current version replaces the state with version + 1."""
    await store.put_state("s1", make_state("a"), None)
    second = await store.put_state("s1", make_state("b", facts=3), expected_version=1)
    third = await store.put_state("s1", DurableContextState(), expected_version=2)
    assert (second.version, third.version) == (2, 3)
    read = await store.get_state("s1")
    assert read is not None and read.version == 3 and read.state.is_empty


async def test_create_conflicts_when_a_state_exists(store: StoreBackend) -> None:
    """expected_version=None on an existing state raises VersionConflict and keeps it."""
    await store.put_state("s1", make_state("a"), None)
    with pytest.raises(VersionConflict) as info:
        await store.put_state("s1", make_state("b"), None)
    assert (info.value.expected_version, info.value.current_version) == (None, 1)
    read = await store.get_state("s1")
    assert read is not None and read.state == make_state("a")


async def test_stale_version_conflicts_and_keeps_state(store: StoreBackend) -> None:
    """A write naming an old version raises VersionConflict carrying the current version."""
    await store.put_state("s1", make_state("a"), None)
    await store.put_state("s1", make_state("b"), 1)
    with pytest.raises(VersionConflict) as info:
        await store.put_state("s1", make_state("c"), 1)
    assert (info.value.session_id, info.value.current_version) == ("s1", 2)
    read = await store.get_state("s1")
    assert read is not None and (read.version, read.state) == (2, make_state("b"))


async def test_update_of_a_missing_state_conflicts(store: StoreBackend) -> None:
    """Naming a version when no state exists is a conflict with current_version None."""
    with pytest.raises(VersionConflict) as info:
        await store.put_state("s1", make_state(), 3)
    assert info.value.current_version is None
    assert await store.get_state("s1") is None


async def test_negative_expected_version_never_matches_a_missing_state(
    store: StoreBackend,
) -> None:
    """Only expected_version=None creates; any number on a missing state is a conflict."""
    for expected in (-1, 0):
        with pytest.raises(VersionConflict):
            await store.put_state("s1", make_state(), expected)
    assert await store.get_state("s1") is None


async def test_delete_reports_whether_a_state_existed(store: StoreBackend) -> None:
    """delete_state removes the state, returns True, and False once nothing is left."""
    await store.put_state("s1", make_state(), None)
    assert await store.delete_state("s1") is True
    assert await store.get_state("s1") is None
    assert await store.delete_state("s1") is False


async def test_delete_with_stale_version_keeps_state(store: StoreBackend) -> None:
    """delete_state with a wrong expected version raises and deletes nothing."""
    await store.put_state("s1", make_state(), None)
    await store.put_state("s1", make_state("b"), 1)
    with pytest.raises(VersionConflict) as info:
        await store.delete_state("s1", expected_version=1)
    assert info.value.current_version == 2
    assert await store.get_state("s1") is not None
    assert await store.delete_state("s1", expected_version=2) is True
    assert await store.get_state("s1") is None


async def test_recreated_state_starts_again_at_version_one(store: StoreBackend) -> None:
    """After a delete, a new state is version 1 and get returns the new content."""
    await store.put_state("s1", make_state("old"), None)
    assert (await store.get_state("s1")) is not None  # warm the decode cache
    await store.delete_state("s1")
    await store.put_state("s1", make_state("new"), None)
    read = await store.get_state("s1")
    assert read is not None and (read.version, read.state) == (1, make_state("new"))


async def test_sessions_are_independent(store: StoreBackend) -> None:
    """Writes to one session neither change nor conflict with another."""
    await store.put_state("s1", make_state("a"), None)
    await store.put_state("s2", make_state("b"), None)
    await store.put_state("s1", make_state("c"), 1)
    s2 = await store.get_state("s2")
    assert s2 is not None and (s2.version, s2.state) == (1, make_state("b"))


async def test_session_ids_with_separators_do_not_collide(store: StoreBackend) -> None:
    """Ids containing ':' or looking like other key kinds map to distinct entries."""
    ids = ["a", "a:b", "record:a", "summary:text", "ü/ñ 🙂"]
    for index, sid in enumerate(ids):
        await store.put_state(sid, make_state(f"t{index}"), None)
        await store.put_record(sid, "kind", sid.encode())
    for index, sid in enumerate(ids):
        read = await store.get_state(sid)
        assert read is not None and (read.version, read.state) == (1, make_state(f"t{index}"))
        assert await store.get_record(sid, "kind") == sid.encode()


# --- several instances on one store -----------------------------------------------------


async def test_state_persists_across_store_instances(store_factory: StoreFactory) -> None:
    """A state written, then read by a new store on the same data, is identical."""
    first = await store_factory.open()
    await first.put_state("s1", make_state("a", facts=5), None)
    await first.put_state("s1", make_state("b", facts=2), 1)
    await first.close()
    second = await store_factory.open()
    try:
        read = await second.get_state("s1")
        assert read is not None and (read.version, read.state) == (2, make_state("b", facts=2))
    finally:
        await second.close()


async def test_two_instances_see_each_others_writes(store_factory: StoreFactory) -> None:
    """A second store's write and delete are visible to the first, even after it cached."""
    a = await store_factory.open()
    b = await store_factory.open()
    try:
        await a.put_state("s1", make_state("a"), None)
        assert (await a.get_state("s1")) is not None
        await b.put_state("s1", make_state("b"), 1)
        read = await a.get_state("s1")
        assert read is not None and (read.version, read.state) == (2, make_state("b"))
        with pytest.raises(VersionConflict):
            await a.put_state("s1", make_state("c"), 1)
        await b.delete_state("s1")
        assert await a.get_state("s1") is None
    finally:
        await a.close()
        await b.close()


async def test_closed_store_refuses_calls(store_factory: StoreFactory) -> None:
    """Every call after close raises StoreError; close itself is idempotent."""
    closed = await store_factory.open()
    await closed.close()
    await closed.close()
    with pytest.raises(StoreError, match="closed"):
        await closed.get_state("s1")
    with pytest.raises(StoreError, match="closed"):
        await closed.put_summary("k", "v")


# --- races ------------------------------------------------------------------------------


async def test_racing_tasks_get_exactly_one_winner(store: StoreBackend) -> None:
    """20 tasks writing from the same version: one succeeds, 19 get VersionConflict."""
    await store.put_state("s1", make_state("base"), None)

    async def attempt(i: int) -> int | VersionConflict:
        try:
            return (await store.put_state("s1", make_state(f"t{i}"), 1)).version
        except VersionConflict as exc:
            return exc

    results = await asyncio.gather(*(attempt(i) for i in range(20)))
    winners = [r for r in results if isinstance(r, int)]
    losers = [r for r in results if isinstance(r, VersionConflict)]
    assert winners == [2]
    assert len(losers) == 19 and all(c.current_version == 2 for c in losers)
    read = await store.get_state("s1")
    assert read is not None and read.version == 2
    assert read.state in {make_state(f"t{i}") for i in range(20)}


async def test_racing_creations_get_exactly_one_winner(store: StoreBackend) -> None:
    """20 tasks creating the same session: exactly one creates version 1."""
    results = await asyncio.gather(
        *(store.put_state("s1", make_state(f"t{i}"), None) for i in range(20)),
        return_exceptions=True,
    )
    assert sum(1 for r in results if not isinstance(r, BaseException)) == 1
    assert sum(1 for r in results if isinstance(r, VersionConflict)) == 19


def _race_in_process(factory: StoreFactory, attempts: int, barrier: Any, results: Any) -> None:
    """Child process body: race to create, then keep trying read-then-CAS writes."""

    async def run() -> tuple[list[int], int]:
        store = await factory.open()
        won: list[int] = []
        conflicts = 0
        try:
            barrier.wait()
            for i in range(attempts):
                current = await store.get_state("shared") if i else None
                expected = None if current is None else current.version
                try:
                    stored = await store.put_state("shared", make_state(f"p{i}"), expected)
                    won.append(stored.version)
                except VersionConflict:
                    conflicts += 1
        finally:
            await store.close()
        return won, conflicts

    results.put(asyncio.run(run()))


async def test_racing_processes_get_one_winner_per_version(store_factory: StoreFactory) -> None:
    """4 processes with their own stores on the same data: each version is won exactly once."""
    await (await store_factory.open()).close()  # the schema exists before the race
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    queue = ctx.Queue()
    procs = [ctx.Process(target=_race_in_process, args=(store_factory, 30, barrier, queue))
             for _ in range(4)]
    for proc in procs:
        proc.start()
    loop = asyncio.get_running_loop()
    outcomes = [await loop.run_in_executor(None, queue.get, True, 60) for _ in procs]
    for proc in procs:
        await loop.run_in_executor(None, proc.join, 30)
        assert proc.exitcode == 0
    won = sorted(v for versions, _ in outcomes for v in versions)
    # Every process first tries to create: exactly one of those four attempts wins.
    assert sum(1 for versions, _ in outcomes if versions[:1] == [1]) == 1
    assert won == list(range(1, len(won) + 1))
    assert sum(len(v) + c for v, c in outcomes) == 4 * 30
    check = await store_factory.open()
    try:
        final = await check.get_state("shared")
        assert final is not None and final.version == len(won)
    finally:
        await check.close()


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
