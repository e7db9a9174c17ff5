"""CachedStateReads: every read checks the store's version (no time window), re-reads the state
only when it changed, and hands the versions it read to the request's other readers."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from compactor import DurableContextState, DurableFact
from proxy.store import CachedStateReads, SessionVersions, SQLiteStateStore
from proxy.store.read_cache import request_versions


def _state(text: str) -> DurableContextState:
    return DurableContextState(facts=(DurableFact("f1", text, "transcript:s:1",
                                                  datetime(2026, 1, 1, tzinfo=UTC)),))


class CountingStore(SQLiteStateStore):
    """The real SQLite store, counting its full state reads."""

    state_reads = 0

    async def get_state(self, session_id: str):  # type: ignore[no-untyped-def]
        self.state_reads += 1
        return await super().get_state(session_id)


async def test_a_write_through_the_cache_is_seen_by_the_next_read(tmp_path: Path) -> None:
    """An admin write via the same object is in the next read."""
    inner = await SQLiteStateStore(tmp_path / "s.db").open()
    store = CachedStateReads(inner)
    try:
        assert await store.get_state("s") is None
        await store.put_state("s", _state("one"), None)
        stored = await store.get_state("s")
        assert stored is not None and stored.state.facts[0].content == "one"
        await store.delete_state("s")
        assert await store.get_state("s") is None
    finally:
        await inner.close()


async def test_another_writer_is_seen_by_the_very_next_read(tmp_path: Path) -> None:
    """A write that bypasses the cache (another process's store on the same file) is in the
    next read, with no time window; an unchanged state is not read again."""
    inner = await CountingStore(tmp_path / "s.db", shared=True).open()
    store = CachedStateReads(inner)
    other = await SQLiteStateStore(tmp_path / "s.db").open()
    try:
        assert await store.get_state("s") is None
        assert inner.state_reads == 0  # no state: the version said so
        await other.put_state("s", _state("elsewhere"), None)
        stored = await store.get_state("s")
        assert stored is not None and stored.state.facts[0].content == "elsewhere"
        assert inner.state_reads == 1
        for _ in range(3):
            assert await store.get_state("s") == stored
        assert inner.state_reads == 1  # unchanged: only its version was read
        await other.put_state("s", _state("again"), stored.version)
        again = await store.get_state("s")
        assert again is not None and again.state.facts[0].content == "again"
        await other.delete_state("s")
        assert await store.get_state("s") is None
    finally:
        await inner.close()
        await other.close()


async def test_a_state_deleted_and_created_again_is_not_taken_for_the_old(
        tmp_path: Path) -> None:
    """Delete + create continues the numbering (version 2), never the old state's."""
    inner = await SQLiteStateStore(tmp_path / "s.db", shared=True).open()
    store = CachedStateReads(inner)
    other = await SQLiteStateStore(tmp_path / "s.db").open()
    try:
        await other.put_state("s", _state("first"), None)
        first = await store.get_state("s")
        assert first is not None and first.version == 1
        await other.delete_state("s")
        await other.put_state("s", _state("second"), None)
        second = await store.get_state("s")
        assert second is not None and second.version == 2
        assert second.state.facts[0].content == "second"
    finally:
        await inner.close()
        await other.close()


async def test_the_versions_read_are_the_requests_and_go_to_the_listeners(
        tmp_path: Path) -> None:
    """The versions of this read are what request_versions gives for this session and store
    (and nothing for another), and each listener is told them."""
    inner = await SQLiteStateStore(tmp_path / "s.db", shared=True).open()
    told: list[tuple[str, SessionVersions]] = []

    async def listener(session_id: str, versions: SessionVersions) -> None:
        told.append((session_id, versions))

    store = CachedStateReads(inner, listeners=[listener])
    try:
        assert request_versions(inner, "s") is None
        version = await inner.put_versioned_record("s", "checkpoint:x", b"data")
        await store.get_state("s")
        read = request_versions(inner, "s")
        assert read is not None and read.records == {"checkpoint:x": version}
        assert request_versions(inner, "other") is None
        assert request_versions(object(), "s") is None
        assert told == [("s", read)]
    finally:
        await inner.close()


class CountingVersions(CountingStore):
    """The real SQLite store, counting its full state reads and its version reads."""

    version_reads = 0

    async def session_versions(self, session_id, fetch=None):  # type: ignore[no-untyped-def]
        self.version_reads += 1
        return await super().session_versions(session_id, fetch)


async def test_a_store_no_other_process_writes_is_not_asked_again(tmp_path: Path) -> None:
    """One process on its own SQLite file: every write goes through the cache, so a cached
    read is current and costs no round trip (the request path's hot case)."""
    inner = await CountingVersions(tmp_path / "s.db").open()
    store = CachedStateReads(inner)
    try:
        assert not inner.shared
        for _ in range(3):
            assert await store.get_state("s") is None
        assert (inner.state_reads, inner.version_reads) == (1, 0)
        await store.put_state("s", _state("one"), None)
        for _ in range(3):
            stored = await store.get_state("s")
            assert stored is not None and stored.state.facts[0].content == "one"
        assert (inner.state_reads, inner.version_reads) == (1, 0)
        await store.delete_state("s")
        assert await store.get_state("s") is None
    finally:
        await inner.close()
