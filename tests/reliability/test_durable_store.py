"""The durable store under contention and crashes: racing versioned writes through the admin
HTTP API (one winner per version, 409 for the rest), a writer process SIGKILLed mid-write
(the file opens, passes ``PRAGMA integrity_check`` and holds only whole versions, each with
its change record), and a proxy restarted on the same file serving exactly the last committed
state."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp

from proxy.store import SQLiteStateStore
from tests.conftest import ProxyFactory
from tests.reliability.conftest import PYTHON, RELIABILITY_ADMIN_TOKEN, REPO
from tests.reliability.store_writer import facts_for

AUTH = {"Authorization": f"Bearer {RELIABILITY_ADMIN_TOKEN}"}
RACERS = 16
VERSIONS = 5


def fact(content: str) -> dict[str, Any]:
    """One fact of an admin PUT body."""
    return {"fact_id": "f1", "content": content, "source_pointer": "transcript:race:1",
            "last_confirmed_at": "2025-03-01T12:00:00Z"}


async def put(http: aiohttp.ClientSession, url: str, content: str,
              if_match: int | None) -> tuple[int, dict[str, Any]]:
    """PUT a one-fact state; the status and JSON body."""
    headers = dict(AUTH)
    if if_match is not None:
        headers["If-Match"] = f'"{if_match}"'
    async with http.put(url, json={"facts": [fact(content)], "pending_items": [],
                                   "retrieval_evidence": []}, headers=headers) as resp:
        return resp.status, await resp.json()


async def test_racing_admin_writes_have_exactly_one_winner_per_version(
    proxy_factory: ProxyFactory
) -> None:
    """16 PUTs from the same version at once, 5 versions in a row: one 200, fifteen 409, and
    GET shows the winner's content at the next version."""
    proxy = proxy_factory(admin_token=RELIABILITY_ADMIN_TOKEN)
    url = f"{proxy.base_url}/admin/sessions/race/state"
    async with aiohttp.ClientSession() as http:
        status, _ = await put(http, url, "first", None)
        assert status == 201
        for version in range(1, VERSIONS + 1):
            answers = await asyncio.gather(*(put(http, url, f"v{version} racer {k}", version)
                                             for k in range(RACERS)))
            statuses = sorted(status for status, _ in answers)
            assert statuses == [200] + [409] * (RACERS - 1)
            winner = next(body for status, body in answers if status == 200)
            for status, body in answers:
                if status == 409:
                    assert body["error"]["type"] == "conflict_error"
            async with http.get(url, headers=AUTH) as resp:
                current = await resp.json()
                assert resp.headers["ETag"] == f'"{version + 1}"'
            assert current == winner
            assert current["version"] == version + 1


def run_writer_until(db: Path, session_id: str, commits: int, delay_s: float = 0.0) -> int:
    """Start a writer process, let it commit ``commits`` more versions, SIGKILL it in the
    middle of its next writes (``delay_s`` later: a moment anywhere in a write); the last
    version it reported committed."""
    process = subprocess.Popen([PYTHON, "-m", "tests.reliability.store_writer", str(db),
                                session_id], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL)
    assert process.stdout is not None
    last = 0
    seen = 0
    timer = threading.Timer(60, process.kill)
    timer.start()
    try:
        for raw in process.stdout:
            last = int(raw.split()[1])
            seen += 1
            if seen >= commits:
                break
        time.sleep(delay_s)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        # The writer runs ahead of this reader: what it printed before dying is still in the
        # pipe. The last of those lines is the last version it reported committed.
        for raw in process.stdout.read().splitlines():
            if raw.startswith(b"committed "):
                last = int(raw.split()[1])
    finally:
        timer.cancel()
        process.stdout.close()
    assert process.returncode == -signal.SIGKILL
    assert seen >= commits
    return last


def assert_whole_version(db: Path, session_id: str, reported: int) -> dict[str, Any]:
    """The file passes integrity_check and holds one whole version at or just after the
    last one reported, and the change record of every version up to it (each written in
    the transaction of its version); returns that state as a dict."""
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]

    async def read() -> Any:
        store = await SQLiteStateStore(db).open()
        try:
            return (await store.get_state(session_id),
                    await store.state_changes("none", session_id, limit=1000))
        finally:
            await store.close()

    stored, changes = asyncio.run(read())
    assert stored is not None
    assert [change.version for change in changes] == list(range(stored.version, 0, -1))
    # The kill may land after a commit but before its "committed" line was printed.
    assert reported <= stored.version <= reported + 1
    facts = stored.state.facts
    assert len(facts) == facts_for(stored.version)
    assert all(f.fact_id.startswith(f"v{stored.version}-") for f in facts)
    assert all(f.content.startswith(f"version {stored.version} ") for f in facts)
    return {"version": stored.version, **stored.state.to_dict()}


def test_writer_killed_mid_write_leaves_whole_versions_and_a_restart_serves_the_last(
    tmp_path: Path, proxy_factory: ProxyFactory
) -> None:
    """Three writer processes SIGKILLed after 5, 40 and 120 commits: each time the store
    opens, is intact and holds a whole version with the change record of every version; a
    proxy on that file serves it via GET."""
    db = tmp_path / "crash" / "state.db"
    expected: dict[str, Any] = {}
    for commits in (5, 40, 120):
        reported = run_writer_until(db, "crash", commits)
        expected = assert_whole_version(db, "crash", reported)
    proxy = proxy_factory({"store": {"path": str(db)}}, admin_token=RELIABILITY_ADMIN_TOKEN)

    async def get() -> tuple[int, str, dict[str, Any]]:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{proxy.base_url}/admin/sessions/crash/state",
                                headers=AUTH) as resp:
                return resp.status, resp.headers["ETag"], await resp.json()

    status, etag, served = asyncio.run(get())
    assert status == 200
    assert etag == f'"{expected["version"]}"'
    assert served == {"session_id": "crash", **expected}


def test_writer_killed_at_any_moment_never_leaves_a_version_without_its_change_record(
    tmp_path: Path
) -> None:
    """Twelve writer processes SIGKILLed a few milliseconds (a few writes) after their third
    commit, so the kill lands anywhere in a write: every time, each version up to the one
    stored has its change record (a state and its record were two commits: about one kill
    in two left the newest version without its record)."""
    db = tmp_path / "crash" / "state.db"
    delays = random.Random(31)
    for _ in range(12):
        reported = run_writer_until(db, "crash", 3, delay_s=delays.uniform(0.0, 0.01))
        assert_whole_version(db, "crash", reported)
