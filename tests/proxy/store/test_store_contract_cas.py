"""The store contract on every backend: versioned CAS writes, several instances, races."""

from __future__ import annotations

import asyncio
import multiprocessing
from typing import Any

import pytest

from compactor import DurableContextState
from proxy.store import (
    RecordStore,
    RequestLog,
    StateStore,
    StoreBackend,
    StoreError,
    SummaryCache,
    UsageLedger,
    VersionConflict,
)
from tests.proxy.store.helpers import StoreFactory, make_state

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
