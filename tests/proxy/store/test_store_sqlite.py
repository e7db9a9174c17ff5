"""What only the SQLite state store does, on real database files: the file itself (parent
directories, WAL, schema version, unopenable paths), corrupt rows, calls kept off the event
loop but for the two small ones a worker makes on every request (and what sends those to the
thread too), and the audit log's batches. The StateStore contract it shares with Redis is in
test_store_contract_*.py."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from proxy.store import CorruptStateError, SQLiteStateStore, StoreError
from tests.proxy.store.helpers import make_state


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStateStore]:
    """An opened store on a fresh file, closed after the test."""
    opened = await SQLiteStateStore(tmp_path / "state.db").open()
    yield opened
    await opened.close()


# --- the file ---------------------------------------------------------------------------


async def test_open_creates_parent_directories(tmp_path: Path) -> None:
    """The database's missing parent directories are created by open."""
    path = tmp_path / "deep" / "er" / "state.db"
    opened = await SQLiteStateStore(path).open()
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
    await (await SQLiteStateStore(path).open()).close()  # create the schema
    conn = sqlite3.connect(path)
    conn.execute("UPDATE schema_version SET version = 99")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="schema version 99"):
        await SQLiteStateStore(path).open()


async def test_unopenable_path_raises_store_error(tmp_path: Path) -> None:
    """A path whose parent is a regular file fails to open with a StoreError."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError, match="cannot open"):
        await SQLiteStateStore(blocker / "state.db").open()


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


# --- the event loop ---------------------------------------------------------------------


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


class CountingHops(SQLiteStateStore):
    """The real store, counting the calls it sends to its worker thread."""

    hops = 0

    async def _call(self, fn, *args):  # type: ignore[no-untyped-def]
        self.hops += 1
        return await super()._call(fn, *args)


async def test_a_workers_versions_read_answers_on_the_event_loop(tmp_path: Path) -> None:
    """``session_versions`` (every request of a worker asks it) is read on the loop's own
    connection, with no hop to the worker thread (~100 µs of CPU for a ~10 µs read), and
    reads what every process wrote; before the file is open, the worker thread reads it."""
    store = CountingHops(tmp_path / "s.db", shared=True)
    other = await SQLiteStateStore(tmp_path / "s.db", shared=True).open()
    try:
        assert (await store.session_versions("s")).records == {}
        assert store.hops == 1  # (not open yet: the worker thread creates the file)
        await other.put_versioned_record("s", "calibration:m", b"x")
        await other.put_state("s", make_state("a"), None)
        for _ in range(3):
            versions = await store.session_versions("s")
        assert store.hops == 1
        assert versions.records == {"calibration:m": 1} and versions.state == 1
        assert versions == await store._call(store._session_versions, "s", None)
    finally:
        await store.close()
        await other.close()
    with pytest.raises(StoreError):
        await store.session_versions("s")


async def test_what_sqlite_cannot_do_at_once_goes_to_the_worker_thread(tmp_path: Path) -> None:
    """A busy or locked database (the loop's connection never waits) sends the call to the
    worker thread, whose connection waits; any other failure is a StoreError."""
    store = await SQLiteStateStore(tmp_path / "s.db", shared=True).open()
    # A database in rollback-journal mode that another connection holds exclusively: a
    # real SQLITE_BUSY for any reader that does not wait.
    side = tmp_path / "side.db"
    holder = sqlite3.connect(side, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")

    def busy(conn: sqlite3.Connection) -> object:
        return sqlite3.connect(side, timeout=0).execute("SELECT * FROM t").fetchall()

    def broken(conn: sqlite3.Connection) -> object:
        return conn.execute("SELECT * FROM no_such_table").fetchall()

    try:
        await store.session_versions("s")  # (opens the loop's connection)
        assert store._now(busy) is None
        with pytest.raises(StoreError, match="no such table"):
            store._now(broken)
    finally:
        holder.close()
        await store.close()


async def test_a_file_the_loop_cannot_open_leaves_the_work_to_the_worker_thread(
        tmp_path: Path) -> None:
    """The file removed after the worker thread opened it: the loop's connection cannot be
    opened (``mode=rw`` never creates a file), so the worker thread's, still open, answers
    as it did before; nothing is created in the removed file's place."""
    store = await CountingHops(tmp_path / "s.db", shared=True).open()
    try:
        await store.put_state("s", make_state("a"), None)
        (tmp_path / "s.db").unlink()
        hops = store.hops
        assert (await store.session_versions("s")).state == 1
        assert await store.put_versioned_record("s", "calibration:m", b"x") == 1
        assert store.hops == hops + 2 and not (tmp_path / "s.db").exists()
    finally:
        await store.close()


async def test_a_workers_record_is_written_on_the_loop_unless_another_writer_holds_the_lock(
        tmp_path: Path) -> None:
    """``put_versioned_record`` (a worker's calibration, after every answer) commits on the
    loop's connection, no hop; while another process holds the write lock it goes to the
    worker thread, which waits for the lock: the version is right either way."""
    store = await CountingHops(tmp_path / "s.db", shared=True).open()
    other = await SQLiteStateStore(tmp_path / "s.db", shared=True).open()
    holder = sqlite3.connect(tmp_path / "s.db", isolation_level=None, check_same_thread=False)
    try:
        hops = store.hops
        assert await store.put_versioned_record("s", "calibration:m", b"one") == 1
        assert await store.put_versioned_record("s", "calibration:m", b"two") == 2
        assert store.hops == hops
        assert await other.get_versioned_record("s", "calibration:m") == (2, b"two")
        holder.execute("BEGIN IMMEDIATE")  # another process writing
        asyncio.get_running_loop().call_later(0.3, holder.execute, "COMMIT")
        assert await store.put_versioned_record("s", "calibration:m", b"three") == 3
        assert store.hops == hops + 1 and not holder.in_transaction
        assert await other.get_versioned_record("s", "calibration:m") == (3, b"three")
        # A large record (a checkpoint's view) is written by the worker thread: no stall.
        assert await store.put_versioned_record("s", "checkpoint:lane", bytes(1 << 20)) == 1
        assert store.hops == hops + 2
    finally:
        holder.close()
        await store.close()
        await other.close()


async def test_the_loops_commits_are_checkpointed_by_the_worker_thread(tmp_path: Path) -> None:
    """The loop's connection never checkpoints (a checkpoint syncs the file): every
    CHECKPOINT_EVERY of its commits, the next write goes to the worker thread, which empties
    the log after it. So the log holds at most that many commits, however many are made."""
    from proxy.store.sqlite import CHECKPOINT_EVERY

    store = await CountingHops(tmp_path / "s.db", shared=True).open()
    wal = tmp_path / "s.db-wal"
    try:
        for _ in range(3):
            hops = store.hops
            for n in range(CHECKPOINT_EVERY):
                await store.put_versioned_record("s", f"calibration:{n % 4}", bytes(8192))
            assert store.hops == hops and wal.stat().st_size > CHECKPOINT_EVERY * 8192
            await store.put_versioned_record("s", "calibration:0", bytes(8192))
            assert store.hops == hops + 1 and wal.stat().st_size == 0
    finally:
        await store.close()


# --- the audit log's batches ------------------------------------------------------------


async def test_audit_entries_added_together_share_one_batch_and_its_future(
        store: SQLiteStateStore) -> None:
    """Entries added within the linger are one batch: the same future for each (at most
    MAX_AUDIT_BATCH per batch), resolved once their one transaction committed; every entry
    is then read back."""
    from proxy.store.audit_batches import MAX_AUDIT_BATCH
    from tests.proxy.store.helpers import entry

    futures = [store.add_request(entry(index, session=f"s{index % 3}"))
               for index in range(MAX_AUDIT_BATCH + 1)]
    assert all(future is futures[0] for future in futures[:MAX_AUDIT_BATCH])
    assert futures[-1] is not futures[0] and not futures[0].done()
    await store.flush()
    assert futures[0].done() and futures[-1].done()
    assert futures[0].exception() is None and futures[-1].exception() is None
    counts = [(await store.session_requests("none", f"s{i}", limit=500))[1] for i in range(3)]
    assert sum(counts) == MAX_AUDIT_BATCH + 1


async def test_a_failed_audit_batch_fails_its_one_future(tmp_path: Path) -> None:
    """A batch whose transaction fails hands the error to its future (every caller of the
    batch sees it), and nothing of it is kept."""
    from proxy.audit.log import RequestEntry
    from tests.proxy.store.helpers import entry

    class Failing(SQLiteStateStore):
        def _add_requests(self, batch: list[RequestEntry]) -> None:
            raise StoreError("disk I/O error")

    failing = await Failing(tmp_path / "state.db").open()
    try:
        first, second = failing.add_request(entry(1)), failing.add_request(entry(2))
        assert first is second
        await failing.flush()
        assert isinstance(first.exception(), StoreError)
        assert await failing.session_requests("none", "sess-1") == ([], 0)
    finally:
        await failing.close()


async def test_a_caller_giving_up_on_its_batch_leaves_the_next_entries_a_batch_of_their_own(
        store: SQLiteStateStore) -> None:
    """A caller that cancels the batch's future (it gave up waiting) does not take later
    entries with it: they get a new batch and future; every entry is still written."""
    from tests.proxy.store.helpers import entry

    first = store.add_request(entry(1))
    first.cancel()
    second = store.add_request(entry(2))
    assert second is not first and not second.done()
    await store.flush()
    assert second.done() and second.exception() is None
    assert (await store.session_requests("none", "sess-1"))[1] == 2
