"""The SQLite state store, on real database files: versioned CAS writes, races between tasks
and between processes, persistence, the compaction caches and event-loop friendliness."""

from __future__ import annotations

import asyncio
import multiprocessing
import sqlite3
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from compactor import DurableContextState, DurableFact, PendingItem, RetrievalEvidence
from proxy.store import (
    CorruptStateError,
    SQLiteStateStore,
    StateStore,
    StoreError,
    VersionConflict,
)

WHEN = datetime(2025, 3, 1, 12, 30, tzinfo=UTC)


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


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStateStore]:
    """An opened store on a fresh file, closed after the test."""
    opened = await SQLiteStateStore.open(tmp_path / "state.db")
    yield opened
    await opened.close()


# --- basic CAS semantics ----------------------------------------------------------------


async def test_store_implements_the_state_store_protocol(store: SQLiteStateStore) -> None:
    """The SQLite backend is usable wherever a StateStore is expected."""
    assert isinstance(store, StateStore)


async def test_first_put_creates_version_one_that_get_returns(store: SQLiteStateStore) -> None:
    """Creating a state yields version 1, and get returns the same state and version."""
    assert await store.get_state("s1") is None
    written = await store.put_state("s1", make_state(), expected_version=None)
    assert written.version == 1
    assert written.session_id == "s1"
    assert written.updated_at.tzinfo is not None
    read = await store.get_state("s1")
    assert read is not None
    assert (read.version, read.state, read.updated_at) == (1, make_state(), written.updated_at)


async def test_put_with_current_version_replaces_and_increments(store: SQLiteStateStore) -> None:
    """A write naming the current version replaces the state with version + 1."""
    await store.put_state("s1", make_state("a"), None)
    second = await store.put_state("s1", make_state("b", facts=3), expected_version=1)
    third = await store.put_state("s1", DurableContextState(), expected_version=2)
    assert (second.version, third.version) == (2, 3)
    read = await store.get_state("s1")
    assert read is not None and read.version == 3 and read.state.is_empty


async def test_create_conflicts_when_a_state_exists(store: SQLiteStateStore) -> None:
    """expected_version=None on an existing state raises VersionConflict and keeps it."""
    await store.put_state("s1", make_state("a"), None)
    with pytest.raises(VersionConflict) as info:
        await store.put_state("s1", make_state("b"), None)
    assert (info.value.expected_version, info.value.current_version) == (None, 1)
    read = await store.get_state("s1")
    assert read is not None and read.state == make_state("a")


async def test_stale_version_conflicts_and_keeps_state(store: SQLiteStateStore) -> None:
    """A write naming an old version raises VersionConflict carrying the current version."""
    await store.put_state("s1", make_state("a"), None)
    await store.put_state("s1", make_state("b"), 1)
    with pytest.raises(VersionConflict) as info:
        await store.put_state("s1", make_state("c"), 1)
    assert info.value.current_version == 2
    assert info.value.session_id == "s1"
    read = await store.get_state("s1")
    assert read is not None and (read.version, read.state) == (2, make_state("b"))


async def test_update_of_a_missing_state_conflicts(store: SQLiteStateStore) -> None:
    """Naming a version when no state exists is a conflict with current_version None."""
    with pytest.raises(VersionConflict) as info:
        await store.put_state("s1", make_state(), 3)
    assert info.value.current_version is None
    assert await store.get_state("s1") is None


async def test_delete_reports_whether_a_state_existed(store: SQLiteStateStore) -> None:
    """delete_state removes the state, returns True, and False once nothing is left."""
    await store.put_state("s1", make_state(), None)
    assert await store.delete_state("s1") is True
    assert await store.get_state("s1") is None
    assert await store.delete_state("s1") is False


async def test_delete_with_stale_version_keeps_state(store: SQLiteStateStore) -> None:
    """delete_state with a wrong expected version raises and deletes nothing."""
    await store.put_state("s1", make_state(), None)
    await store.put_state("s1", make_state("b"), 1)
    with pytest.raises(VersionConflict) as info:
        await store.delete_state("s1", expected_version=1)
    assert info.value.current_version == 2
    assert await store.get_state("s1") is not None
    assert await store.delete_state("s1", expected_version=2) is True


async def test_recreated_state_starts_again_at_version_one(store: SQLiteStateStore) -> None:
    """After a delete, a new state is version 1 and get returns the new content."""
    await store.put_state("s1", make_state("old"), None)
    assert (await store.get_state("s1")) is not None  # warm the decode cache
    await store.delete_state("s1")
    await store.put_state("s1", make_state("new"), None)
    read = await store.get_state("s1")
    assert read is not None and (read.version, read.state) == (1, make_state("new"))


async def test_sessions_are_independent(store: SQLiteStateStore) -> None:
    """Writes to one session neither change nor conflict with another."""
    await store.put_state("s1", make_state("a"), None)
    await store.put_state("s2", make_state("b"), None)
    await store.put_state("s1", make_state("c"), 1)
    s2 = await store.get_state("s2")
    assert s2 is not None and (s2.version, s2.state) == (1, make_state("b"))


# --- the file ---------------------------------------------------------------------------


async def test_state_persists_across_reopen(tmp_path: Path) -> None:
    """A state written, then read by a new store on the same file, is identical."""
    path = tmp_path / "state.db"
    first = await SQLiteStateStore.open(path)
    await first.put_state("s1", make_state("a", facts=5), None)
    await first.put_state("s1", make_state("b", facts=2), 1)
    await first.close()
    second = await SQLiteStateStore.open(path)
    try:
        read = await second.get_state("s1")
        assert read is not None and (read.version, read.state) == (2, make_state("b", facts=2))
    finally:
        await second.close()


async def test_open_creates_parent_directories(tmp_path: Path) -> None:
    """The database's missing parent directories are created by open."""
    path = tmp_path / "deep" / "er" / "state.db"
    opened = await SQLiteStateStore.open(path)
    await opened.close()
    assert path.is_file()


async def test_database_uses_wal_and_records_schema_version(store: SQLiteStateStore) -> None:
    """The file is in WAL journal mode and its schema_version table holds one version."""
    conn = sqlite3.connect(store.path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(1,)]
    finally:
        conn.close()


async def test_newer_schema_version_is_refused(tmp_path: Path) -> None:
    """A file whose schema is newer than the code fails to open with a StoreError."""
    path = tmp_path / "state.db"
    await (await SQLiteStateStore.open(path)).close()  # create the schema
    conn = sqlite3.connect(path)
    conn.execute("UPDATE schema_version SET version = 99")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="schema version 99"):
        await SQLiteStateStore.open(path)


async def test_unopenable_path_raises_store_error(tmp_path: Path) -> None:
    """A path whose parent is a regular file fails to open with a StoreError."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError, match="cannot open"):
        await SQLiteStateStore.open(blocker / "state.db")


@pytest.mark.parametrize(
    ("state_json", "detail"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"facts": [{"fact_id": "f"}]}', "facts[0].content: missing"),
        ('{"facts": [{"fact_id": "f", "content": "c", "source_pointer": "p",'
         ' "last_confirmed_at": "2025-01-01T00:00:00"}]}',
         "facts[0].last_confirmed_at: timestamp has no timezone"),
    ],
)
async def test_corrupt_row_raises_instead_of_returning_garbage(
    store: SQLiteStateStore, state_json: str, detail: str
) -> None:
    """A row that does not decode into a valid state raises CorruptStateError naming why."""
    conn = sqlite3.connect(store.path)
    conn.execute(
        "INSERT INTO session_state (session_id, version, state_json, updated_at)"
        " VALUES ('bad', 1, ?, '2025-01-01T00:00:00+00:00')", (state_json,),
    )
    conn.commit()
    conn.close()
    with pytest.raises(CorruptStateError) as info:
        await store.get_state("bad")
    assert info.value.session_id == "bad"
    assert detail in info.value.detail


async def test_two_instances_on_one_file_see_each_others_writes(tmp_path: Path) -> None:
    """A second store's write is visible to the first, even after the first cached it."""
    path = tmp_path / "state.db"
    a = await SQLiteStateStore.open(path)
    b = await SQLiteStateStore.open(path)
    try:
        await a.put_state("s1", make_state("a"), None)
        assert (await a.get_state("s1")) is not None
        await b.put_state("s1", make_state("b"), 1)
        read = await a.get_state("s1")
        assert read is not None and (read.version, read.state) == (2, make_state("b"))
        with pytest.raises(VersionConflict):
            await a.put_state("s1", make_state("c"), 1)
    finally:
        await a.close()
        await b.close()


async def test_closed_store_refuses_calls(tmp_path: Path) -> None:
    """Every call after close raises StoreError; close itself is idempotent."""
    closed = await SQLiteStateStore.open(tmp_path / "state.db")
    await closed.close()
    await closed.close()
    with pytest.raises(StoreError, match="closed"):
        await closed.get_state("s1")
    with pytest.raises(StoreError, match="closed"):
        await closed.put_summary("k", "v")


# --- races ------------------------------------------------------------------------------


async def test_racing_tasks_get_exactly_one_winner(store: SQLiteStateStore) -> None:
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


async def test_racing_creations_get_exactly_one_winner(store: SQLiteStateStore) -> None:
    """20 tasks creating the same session: exactly one creates version 1."""
    results = await asyncio.gather(
        *(store.put_state("s1", make_state(f"t{i}"), None) for i in range(20)),
        return_exceptions=True,
    )
    assert sum(1 for r in results if not isinstance(r, BaseException)) == 1
    assert sum(1 for r in results if isinstance(r, VersionConflict)) == 19


def _race_in_process(path: str, attempts: int, barrier: Any, results: Any) -> None:
    """Child process body: race to create, then keep trying read-then-CAS writes."""

    async def run() -> tuple[list[int], int]:
        store = await SQLiteStateStore.open(path)
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


async def test_racing_processes_get_one_winner_per_version(tmp_path: Path) -> None:
    """4 processes with their own stores on one file: each version is won exactly once."""
    path = str(tmp_path / "state.db")
    await (await SQLiteStateStore.open(path)).close()  # the schema exists before the race
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    queue = ctx.Queue()
    procs = [ctx.Process(target=_race_in_process, args=(path, 30, barrier, queue))
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
    check = await SQLiteStateStore.open(path)
    try:
        final = await check.get_state("shared")
        assert final is not None and final.version == len(won)
    finally:
        await check.close()


async def test_event_loop_keeps_running_during_writes(store: SQLiteStateStore) -> None:
    """A ticker task runs between the steps of 200 sequential writes: sqlite is off-loop."""
    ticks = 0
    done = False

    async def ticker() -> None:
        nonlocal ticks
        while not done:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    start = ticks
    version: int | None = None
    for i in range(200):
        version = (await store.put_state("s1", make_state(f"w{i}"), version)).version
    done = True
    await task
    assert version == 200
    # Blocking calls would never yield, so the ticker would not run at all meanwhile.
    assert ticks - start >= 200


# --- caches -----------------------------------------------------------------------------


async def test_summary_round_trips_and_misses_are_none(store: SQLiteStateStore) -> None:
    """A stored summary comes back by key; an unknown key gives None."""
    await store.put_summary("sha256:abc", "the user asked for a refactor")
    assert await store.get_summary("sha256:abc") == "the user asked for a refactor"
    assert await store.get_summary("sha256:other") is None


async def test_summary_cache_keeps_only_the_newest_entries(tmp_path: Path) -> None:
    """Beyond max_summaries entries the oldest are evicted, the newest kept."""
    small = await SQLiteStateStore.open(tmp_path / "state.db", max_summaries=5)
    try:
        for i in range(12):
            await small.put_summary(f"k{i}", f"summary {i}")
        kept = [i for i in range(12) if await small.get_summary(f"k{i}") is not None]
        assert kept == [7, 8, 9, 10, 11]
        conn = sqlite3.connect(small.path)
        assert conn.execute("SELECT COUNT(*) FROM summary_cache").fetchone()[0] == 5
        conn.close()
    finally:
        await small.close()


async def test_summary_put_of_a_cached_key_keeps_the_first_text(store: SQLiteStateStore) -> None:
    """The cache is content-addressed: a second put of a key does not replace its text."""
    await store.put_summary("k", "first")
    await store.put_summary("k", "second")
    assert await store.get_summary("k") == "first"


async def test_records_round_trip_per_session_and_kind(store: SQLiteStateStore) -> None:
    """Records are opaque bytes keyed by (session, kind); a put replaces the old bytes."""
    await store.put_record("s1", "l4-spans", b"\x00\x01binary")
    await store.put_record("s1", "other", b"x")
    await store.put_record("s2", "l4-spans", b"y")
    await store.put_record("s1", "l4-spans", b"replaced")
    assert await store.get_record("s1", "l4-spans") == b"replaced"
    assert await store.get_record("s1", "other") == b"x"
    assert await store.get_record("s2", "l4-spans") == b"y"
    assert await store.get_record("s3", "l4-spans") is None


async def test_caches_survive_a_state_delete(store: SQLiteStateStore) -> None:
    """Deleting the durable state leaves the session's compaction records alone."""
    await store.put_state("s1", make_state(), None)
    await store.put_record("s1", "l4-spans", b"data")
    await store.delete_state("s1")
    assert await store.get_record("s1", "l4-spans") == b"data"
