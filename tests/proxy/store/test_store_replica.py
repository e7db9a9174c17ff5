"""The store's replica-consistency part (ReplicaConsistency), on every backend: versioned
records and a session's versions in one read, leases with a token and an expiry, between
tasks and between processes (SQLite: two processes on one file; Redis: one server)."""

from __future__ import annotations

import asyncio
import multiprocessing
from typing import Any

import pytest

from compactor import DurableContextState
from proxy.store import (
    RecordFetch,
    ReplicaConsistency,
    SessionVersions,
    SQLiteStateStore,
)
from proxy.summary.flights import fleet_single_flight
from tests.proxy.store.helpers import StoreFactory, make_state


async def test_the_backend_has_the_replica_part(store: Any) -> None:
    assert isinstance(store, ReplicaConsistency)


async def test_versioned_records_and_the_sessions_versions(store: Any) -> None:
    """Each write bumps its record's version; the versions read names the state's version and
    write time and every record's version, and nothing of another session."""
    assert await store.session_versions("s") == SessionVersions()
    assert await store.get_versioned_record("s", "checkpoint:a") is None
    assert await store.put_versioned_record("s", "checkpoint:a", b"\x00one") == 1
    assert await store.put_versioned_record("s", "checkpoint:a", b"\x00two") == 2
    assert await store.put_versioned_record("s", "calibration:m", b"c") == 1
    assert await store.put_versioned_record("t", "checkpoint:a", b"t") == 1
    assert await store.get_versioned_record("s", "checkpoint:a") == (2, b"\x00two")
    # The same record space as get_record.
    assert await store.get_record("s", "checkpoint:a") == b"\x00two"
    stored = await store.put_state("s", make_state("x"), None)
    versions = await store.session_versions("s")
    assert versions.records == {"checkpoint:a": 2, "calibration:m": 1}
    assert versions.state == 1 and versions.same_state(stored)
    assert not versions.same_state(None)
    assert (await store.session_versions("t")).same_state(None)


async def test_a_versions_read_brings_the_records_of_a_prefix_not_held(store: Any) -> None:
    """With a :class:`RecordFetch`, the versions read also returns each record of the
    prefix whose version is not the one held (with that version), and no other: not one
    held at its version, not another prefix's, not another session's. Without one, none."""
    await store.put_versioned_record("s", "calibration:a", b"a1")
    await store.put_versioned_record("s", "calibration:a", b"\x00a2")
    await store.put_versioned_record("s", "calibration:b", b"b1")
    await store.put_versioned_record("s", "calibration:c", b"c1")
    await store.put_versioned_record("s", "checkpoint:lane", b"big")
    await store.put_versioned_record("t", "calibration:a", b"t1")
    everything = await store.session_versions("s", RecordFetch("calibration:"))
    assert everything.fetched == {"calibration:a": (2, b"\x00a2"), "calibration:b": (1, b"b1"),
                                  "calibration:c": (1, b"c1")}
    assert everything.records == {"calibration:a": 2, "calibration:b": 1, "calibration:c": 1,
                                  "checkpoint:lane": 1}
    held = RecordFetch("calibration:", {"calibration:a": 1, "calibration:b": 1,
                                        "calibration:gone": 4})
    changed = await store.session_versions("s", held)
    assert changed.fetched == {"calibration:a": (2, b"\x00a2"), "calibration:c": (1, b"c1")}
    assert changed.records == everything.records
    assert (await store.session_versions("s")).fetched == {}
    assert (await store.session_versions("u", RecordFetch("calibration:"))) == SessionVersions()


async def test_a_lease_has_one_holder_until_released_or_expired(store: Any) -> None:
    assert await store.acquire_lock("summary:k", "a", 10_000)
    assert not await store.acquire_lock("summary:k", "b", 10_000)
    assert not await store.release_lock("summary:k", "b")  # never another holder's
    assert not await store.extend_lock("summary:k", "b", 10_000)
    assert await store.extend_lock("summary:k", "a", 10_000)
    assert await store.release_lock("summary:k", "a")
    assert await store.acquire_lock("summary:k", "b", 150)
    await asyncio.sleep(0.3)  # b died: its lease expired
    assert not await store.extend_lock("summary:k", "b", 10_000)
    assert await store.acquire_lock("summary:k", "c", 10_000)
    assert not await store.release_lock("summary:k", "b")
    assert await store.release_lock("summary:k", "c")


async def test_fleet_single_flight_waits_for_the_holder_and_takes_over_a_dead_one(
        store: Any) -> None:
    """Two 'processes' (two flights on one store): the second gets the first's result by
    polling; a holder that never releases (died) is taken over once its lease expires."""
    result: dict[str, str] = {}
    calls: list[str] = []

    async def poll() -> str | None:
        return result.get("k")

    async def work(name: str, delay: float) -> str:
        calls.append(name)
        await asyncio.sleep(delay)
        result["k"] = name
        return name

    first = asyncio.create_task(fleet_single_flight(store, "lease-a", poll,
                                                    lambda: work("first", 0.3), timeout_s=5))
    await asyncio.sleep(0.05)
    second = await fleet_single_flight(store, "lease-a", poll, lambda: work("second", 0),
                                       timeout_s=5)
    assert await first == ("first", "made")
    assert second == ("first", "joined") and calls == ["first"]

    # A dead holder: its lease is there, nobody renews or releases it.
    assert await store.acquire_lock("lease-b", "dead", 300)
    result.clear()
    taken = await fleet_single_flight(store, "lease-b", poll, lambda: work("taker", 0),
                                      timeout_s=5)
    assert taken == ("taker", "made")
    # A waiter that gives up: bounded by timeout_s.
    assert await store.acquire_lock("lease-c", "busy", 60_000)
    result.clear()
    assert await fleet_single_flight(store, "lease-c", poll, lambda: work("never", 0),
                                     timeout_s=0.2) == (None, "timeout")


def _lease_race(factory: StoreFactory, name: str, barrier: Any, results: Any) -> None:
    async def run() -> None:
        opened = await factory.open()
        try:
            barrier.wait()
            won = [await opened.acquire_lock(f"race-{i}", f"{name}-token", 60_000)
                   for i in range(20)]
            version = await opened.put_versioned_record("s", "checkpoint:race", name.encode())
            results.put((name, won, version))
        finally:
            await opened.close()

    asyncio.run(run())


async def test_leases_and_versions_hold_across_processes(store_factory: StoreFactory) -> None:
    """Three processes race for twenty leases: each lease has exactly one winner; their
    versioned writes get three distinct versions, and the last one's record is stored."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(3)
    queue = ctx.Queue()
    procs = [ctx.Process(target=_lease_race, args=(store_factory, f"p{i}", barrier, queue))
             for i in range(3)]
    for proc in procs:
        proc.start()
    results = [queue.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    for i in range(20):
        assert sum(won[i] for _, won, _ in results) == 1
    assert sorted(version for *_, version in results) == [1, 2, 3]
    last = max(results, key=lambda r: r[2])[0]
    opened = await store_factory.open()
    try:
        assert await opened.get_versioned_record("s", "checkpoint:race") == (3, last.encode())
    finally:
        await opened.close()


@pytest.mark.parametrize("shared", [False, True])
async def test_sqlite_says_whether_it_is_shared(tmp_path: Any, shared: bool) -> None:
    opened = await SQLiteStateStore(tmp_path / "s.db", shared=shared).open()
    try:
        assert opened.shared is shared
    finally:
        await opened.close()


def _unused(state: DurableContextState) -> None:  # keeps make_state's import honest
    del state
