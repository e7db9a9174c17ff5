"""SessionCheckpoints on a shared store: a copy in memory is used only at the store's version
of its (session, lane); a miss never hides a checkpoint written since; the record carries the
covered messages' fingerprints; a record of an older format is ignored; an unshared store's
memory is authoritative."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import compactor
from proxy.store import CachedStateReads, SQLiteStateStore
from proxy.store.checkpoints import CHECKPOINT_RECORD_PREFIX, SessionCheckpoints


def checkpoint(turns: int) -> compactor.CompactionCheckpoint:
    raw: list[dict[str, Any]] = [{"role": "user", "content": f"turn {i}"} for i in range(turns)]
    return compactor.CompactionCheckpoint.build(raw, raw[-2:], "policy", ("L4",))


async def test_a_checkpoint_written_elsewhere_replaces_the_one_in_memory_and_a_miss(
        tmp_path: Path) -> None:
    a_store = await SQLiteStateStore(tmp_path / "s.db", shared=True).open()
    b_store = await SQLiteStateStore(tmp_path / "s.db", shared=True).open()
    a, b = SessionCheckpoints(a_store), SessionCheckpoints(b_store)
    try:
        assert await b.load("s", "lane") is None  # a miss, remembered at "no version"
        await a.save("s", "lane", checkpoint(4))
        found = await b.load("s", "lane")
        assert found is not None and found.covered == 4
        await b.save("s", "lane", checkpoint(6))
        again = await a.load("s", "lane")  # a's own (older) copy is not the store's
        assert again is not None and again.covered == 6
        # The record is the checkpoint's own bytes, fingerprints included.
        assert again == checkpoint(6)
        found_record = await a_store.get_versioned_record("s", CHECKPOINT_RECORD_PREFIX + "lane")
        assert found_record is not None and found_record[1] == checkpoint(6).to_bytes()
    finally:
        await a_store.close()
        await b_store.close()


async def test_the_requests_versions_spare_a_round_trip(tmp_path: Path) -> None:
    """After the request's state read, loading an unchanged checkpoint reads nothing more."""

    class Counting(SQLiteStateStore):
        reads = 0

        async def session_versions(self, session_id: str, fetch: Any = None) -> Any:
            self.reads += 1
            return await super().session_versions(session_id, fetch)

    store = await Counting(tmp_path / "s.db", shared=True).open()
    states = CachedStateReads(store)
    checkpoints = SessionCheckpoints(store)
    try:
        await checkpoints.save("s", "lane", checkpoint(3))
        await states.get_state("s")
        assert store.reads == 1
        assert (await checkpoints.load("s", "lane")) is not None
        assert store.reads == 1
    finally:
        await store.close()


async def test_a_record_of_the_format_before_is_ignored(tmp_path: Path) -> None:
    """A checkpoint stored by a version whose fingerprints were salted per process (format 1:
    digests, and fingerprints under that process's salt) is never used: compaction starts
    afresh, and the next checkpoint replaces it."""
    store = await SQLiteStateStore(tmp_path / "s.db", shared=True).open()
    old = (b'{"format":1,"covered":1,"view":[{"role":"user","content":"turn 0"}],'
           b'"digests":["0123456789abcdef0123456789abcdef"],"policy_key":"policy",'
           b'"layers":["L4"],"compact_proxy_fingerprints":"-42:AAAAAAAAAAA="}')
    try:
        await store.put_versioned_record("s", CHECKPOINT_RECORD_PREFIX + "lane", old)
        checkpoints = SessionCheckpoints(store)
        assert await checkpoints.load("s", "lane") is None
        await checkpoints.save("s", "lane", checkpoint(5))
        assert await SessionCheckpoints(store).load("s", "lane") == checkpoint(5)
    finally:
        await store.close()


async def test_an_unshared_store_keeps_memory_authoritative(tmp_path: Path) -> None:
    """One process on its own file: what it saved is used without asking the store."""
    store = await SQLiteStateStore(tmp_path / "s.db").open()
    other = await SQLiteStateStore(tmp_path / "s.db").open()
    checkpoints = SessionCheckpoints(store)
    try:
        await checkpoints.save("s", "lane", checkpoint(3))
        await other.put_versioned_record("s", CHECKPOINT_RECORD_PREFIX + "lane",
                                         checkpoint(9).to_bytes())
        found = await checkpoints.load("s", "lane")
        assert found is not None and found.covered == 3
    finally:
        await store.close()
        await other.close()
