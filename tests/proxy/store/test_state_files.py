"""The files the proxy keeps durable state in are private to its user whatever the umask: a
real proxy on a store in a new directory creates ``state.db`` (and SQLite its ``-wal`` and
``-shm``) ``0600`` and the directories ``0700``; an existing file others may read is narrowed."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from proxy.store import SQLiteStateStore
from tests.conftest import ProxyFactory

TOKEN = "state-files-admin-token-0123456789abcdef"


def mode(path: Path) -> str:
    """The permission bits of ``path``, in octal (``0o600``)."""
    return oct(stat.S_IMODE(os.stat(path).st_mode))


@pytest.fixture(params=[0o022, 0o000], ids=["umask-022", "umask-000"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    """The process's umask for the test (restored after)."""
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


async def test_a_proxy_creates_its_state_file_and_directories_private(
        umask: int, tmp_path: Path, proxy_factory: ProxyFactory) -> None:
    """A proxy whose store.path is in directories that do not exist yet: after a state is
    written, the database, its -wal and -shm are 0600 and the directories it made 0700."""
    db = tmp_path / "private" / "state" / "state.db"
    proxy = proxy_factory({"store": {"path": str(db)}}, admin_token=TOKEN)
    async with aiohttp.ClientSession() as http:
        async with http.put(f"{proxy.base_url}/admin/sessions/files/state",
                            headers={"Authorization": f"Bearer {TOKEN}"},
                            json={"facts": [], "pending_items": [],
                                  "retrieval_evidence": []}) as resp:
            assert resp.status == 201
    files = [db, db.with_name("state.db-wal"), db.with_name("state.db-shm")]
    assert {path.name: mode(path) for path in files} == {path.name: "0o600" for path in files}
    assert mode(tmp_path / "private") == "0o700"
    assert mode(tmp_path / "private" / "state") == "0o700"


async def test_an_existing_state_file_others_may_read_is_narrowed(
        umask: int, tmp_path: Path) -> None:
    """A state file (and a -wal) left 0644 by an earlier version: opening the store makes
    them 0600; the directory, the operator's, keeps its mode."""
    db = tmp_path / "state.db"
    db.touch()
    db.with_name("state.db-wal").touch()
    for path in (db, db.with_name("state.db-wal")):
        os.chmod(path, 0o644)
    os.chmod(tmp_path, 0o755)
    store = await SQLiteStateStore(db).open()
    try:
        assert mode(db) == "0o600"
        assert mode(db.with_name("state.db-wal")) == "0o600"
        assert mode(tmp_path) == "0o755"
    finally:
        await store.close()
