"""The store's integrity guarantees on every backend (SQLite on a real file, Redis on a real
``redis-server`` and a real Redis Cluster): a session's versions are never reused across
deletes, in one store instance or several, and a write carrying its change record keeps both
in one atomic step (a conflicting or refused write records nothing)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from proxy.audit.log import StateChange
from proxy.store import StoreBackend, VersionConflict
from tests.proxy.store.helpers import StoreFactory, make_state

TENANT = "t0123456789abcdef"


def change(action: str, session: str = "s1", tenant: str = "none") -> StateChange:
    """A change of ``session`` as the admin API hands it to a write (no version yet)."""
    return StateChange(at=datetime.now(UTC), session_id=session, tenant=tenant,
                       actor="admin-api", action=action,  # type: ignore[arg-type]
                       version=None, detail=(f"{action} of {session}",))


async def recorded(store: StoreBackend, session: str = "s1",
                   tenant: str = "none") -> list[tuple[str, int | None]]:
    """The session's changes, oldest first, as (action, version)."""
    return [(c.action, c.version) for c in reversed(await store.state_changes(tenant, session))]


async def test_versions_continue_across_deletes(store: StoreBackend) -> None:
    """Create, replace, delete, create, delete, create: versions 1, 2, 3, 4; every version
    read before a delete is stale for the state created after it."""
    assert (await store.put_state("s1", make_state("a"), None)).version == 1
    assert (await store.put_state("s1", make_state("b"), 1)).version == 2
    assert await store.delete_state("s1", 2) is True
    assert (await store.put_state("s1", make_state("c"), None)).version == 3
    assert await store.delete_state("s1") is True
    assert (await store.put_state("s1", make_state("d"), None)).version == 4
    for stale in (1, 2, 3):
        with pytest.raises(VersionConflict) as info:
            await store.put_state("s1", make_state("stale"), stale)
        assert info.value.current_version == 4
        with pytest.raises(VersionConflict):
            await store.delete_state("s1", stale)
    read = await store.get_state("s1")
    assert read is not None and (read.version, read.state) == (4, make_state("d"))


async def test_versions_continue_after_a_delete_by_another_instance(
        store_factory: StoreFactory) -> None:
    """The deleted version is kept in the store, not in a process: a new instance creating
    the state again continues after it."""
    first = await store_factory.open()
    try:
        await first.put_state("s1", make_state("a"), None)
        await first.put_state("s1", make_state("b"), 1)
        await first.delete_state("s1")
    finally:
        await first.close()
    second = await store_factory.open()
    try:
        assert (await second.put_state("s1", make_state("c"), None)).version == 3
        assert (await second.put_state("other", make_state("c"), None)).version == 1
    finally:
        await second.close()


async def test_a_write_records_its_change_with_the_version_written(store: StoreBackend) -> None:
    """put_state and delete_state with a change: each change is kept with the version the
    write produced (a put's version is filled in by the store)."""
    await store.put_state("s1", make_state("a"), None, change("put"))
    await store.put_state("s1", make_state("b"), 1, change("put"))
    assert await store.delete_state("s1", 2, change("delete")) is True
    await store.put_state("s1", make_state("c"), None, change("put"))
    assert await recorded(store) == [("put", 1), ("put", 2), ("delete", None), ("put", 3)]
    key = f"{TENANT}/s1"
    await store.put_state(key, make_state("t"), None, change("put", tenant=TENANT))
    assert await recorded(store, tenant=TENANT) == [("put", 1)]


async def test_a_write_that_does_not_happen_records_nothing(store: StoreBackend) -> None:
    """A conflicting put, a conflicting delete and a delete of nothing keep no change."""
    await store.put_state("s1", make_state("a"), None, change("put"))
    with pytest.raises(VersionConflict):
        await store.put_state("s1", make_state("b"), None, change("put"))
    with pytest.raises(VersionConflict):
        await store.put_state("s1", make_state("b"), 7, change("put"))
    with pytest.raises(VersionConflict):
        await store.delete_state("s1", 7, change("delete"))
    assert await store.delete_state("never", None, change("delete", "never")) is False
    assert await recorded(store) == [("put", 1)]
    assert await recorded(store, "never") == []


@pytest.mark.parametrize(("session", "tenant", "action"), [
    ("s2", "none", "put"),  # another session
    ("s1", TENANT, "put"),  # the same id, another tenant
    ("s1", "none", "delete"),  # another action
])
async def test_a_change_of_another_write_is_refused_and_nothing_written(
        store: StoreBackend, session: str, tenant: str, action: str) -> None:
    """A change naming another session, tenant or action than the write: ValueError, and
    neither the state nor the change is kept."""
    with pytest.raises(ValueError, match="change"):
        await store.put_state("s1", make_state(), None, change(action, session, tenant))
    assert await store.get_state("s1") is None
    assert await recorded(store, session, tenant) == []
    with pytest.raises(TypeError):
        await store.put_state("s1", make_state(), None, "put")  # type: ignore[arg-type]
