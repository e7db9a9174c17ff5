"""The store contract (every part of StoreBackend), run against every backend (SQLite on a
real file, Redis on a real ``redis-server`` and on a real three-master Redis Cluster):
versioned CAS writes, races between tasks and between processes, persistence, several
instances on one store, the compaction caches, the usage ledger, the audit log and
closing."""

from __future__ import annotations

import asyncio
import importlib
import multiprocessing
import pkgutil
import sqlite3
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from compactor import DurableContextState, DurableFact, PendingItem, RetrievalEvidence
from proxy.accounting.usage import UsageEntry
from proxy.audit.log import LayerSaving, RequestEntry, SessionSummary, StateChange
from proxy.store import (
    RecordStore,
    RedisStateStore,
    RequestLog,
    SQLiteStateStore,
    StateStore,
    StoreBackend,
    StoreError,
    SummaryCache,
    UsageLedger,
    UsageRow,
    VersionConflict,
)

WHEN = datetime(2025, 3, 1, 12, 30, tzinfo=UTC)
BACKENDS = ["sqlite", "redis", "redis-cluster"]


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

    async def open(self, *, max_summaries: int = 1000, max_requests_per_session: int = 1000,
                   retention_days: int = 14) -> StoreBackend:
        """A new store instance on this test's data."""
        # (A short linger: each awaited entry is written within it; a batch still gathers
        # the entries added without waiting.)
        bounds = {"max_requests_per_session": max_requests_per_session,
                  "retention_days": retention_days, "audit_linger_s": 0.01}
        if self.backend == "sqlite":
            return await SQLiteStateStore(self.location, max_summaries=max_summaries,
                                          **bounds).open()
        mode = "cluster" if self.backend == "redis-cluster" else "standalone"
        return await RedisStateStore(self.location, mode=mode, max_summaries=max_summaries,
                                     key_prefix=self.key_prefix, **bounds).open()

    async def stored_summary_counts(self) -> tuple[int, ...]:
        """How many entries each of the backend's summary-cache structures holds, read raw."""
        if self.backend == "sqlite":
            conn = sqlite3.connect(self.location)
            try:
                return (conn.execute("SELECT COUNT(*) FROM summary_cache").fetchone()[0],)
            finally:
                conn.close()
        # The text hash and the age index must agree, or entries leak.
        client: aioredis.Redis | RedisCluster = (
            RedisCluster.from_url(self.location) if self.backend == "redis-cluster"
            else aioredis.Redis.from_url(self.location))
        try:
            return (await client.hlen(f"{self.key_prefix}{{summary}}:summary:text"),
                    await client.zcard(f"{self.key_prefix}{{summary}}:summary:order"))
        finally:
            await client.aclose()


@pytest.fixture(params=BACKENDS)
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    """This test's store location on each backend; Redis is started only when asked for."""
    if request.param == "sqlite":
        return StoreFactory("sqlite", str(tmp_path / "state.db"))
    if request.param == "redis-cluster":
        cluster_url: str = request.getfixturevalue("redis_cluster_url")
        return StoreFactory("redis-cluster", cluster_url, unique_prefix())
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
    for part in (SummaryCache, RecordStore, UsageLedger, RequestLog, StoreBackend):
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


async def test_recreated_state_continues_after_the_deleted_version(store: StoreBackend) -> None:
    """After a delete, a new state is the deleted one's version plus 1 (versions are never
    reused) and get returns the new content."""
    await store.put_state("s1", make_state("old"), None)
    assert (await store.get_state("s1")) is not None  # warm the decode cache
    await store.delete_state("s1")
    await store.put_state("s1", make_state("new"), None)
    read = await store.get_state("s1")
    assert read is not None and (read.version, read.state) == (2, make_state("new"))


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


# --- the audit log ----------------------------------------------------------------------

NOW = datetime.now(UTC).replace(microsecond=123456)


def entry(index: int, *, session: str = "sess-1", tenant: str = "none",
          blocked: bool = False, at: datetime | None = None) -> RequestEntry:
    """Request entry ``index`` of a session: ``index`` seconds after NOW - 1 h, every field
    set (a refused one has a reason and a hard limit, and no usage)."""
    return RequestEntry(
        at=at or NOW - timedelta(hours=1) + timedelta(seconds=index),
        request_id=f"req-{session}-{index:04d}", session_id=session, tenant=tenant,
        route="messages" if index % 3 else "count_tokens", role="main",
        model="claude-sonnet-4-5", tokens_before=1000 + index, tokens_after=400 + index,
        layers=(LayerSaving("L1", 300), LayerSaving("L3", 300 + index)),
        outcome="blocked" if blocked else "forwarded",
        reason="MessageViewLimitExceeded" if blocked else None,
        hard_limit=800 if blocked else None, status=400 if blocked else 200,
        upstream_status=None if blocked else 200,
        usage_input=None if blocked else 350, usage_cache_read=None if blocked else 40,
        usage_cache_write=None if blocked else 7, usage_output=None if blocked else 12,
        duration_ms=12.5 + index,
    )


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
