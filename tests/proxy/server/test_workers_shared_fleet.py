"""``serve --workers 2`` on SQLite and on Redis: requests spread, CAS, the console, log lines."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.proxy.server.workers_fleet import (
    ADMIN_TOKEN,
    API_KEY,
    AUTH,
    Fleet,
    fleet,
    fresh_client,
    metric,
    post_messages,
    write_config,
)

pytestmark = pytest.mark.slow


# -- one fleet per store backend: requests, CAS, the console ------------------------------------


@pytest.fixture(scope="module", params=["sqlite", "redis"])
def shared_fleet(request: pytest.FixtureRequest, upstream: str,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Two workers (``--workers 2`` over ``listen.workers: 3`` in the YAML) on SQLite, then
    on Redis."""
    backend = request.param
    redis_url = request.getfixturevalue("redis_url") if backend == "redis" else ""
    directory = tmp_path_factory.mktemp(f"fleet-{backend}")
    config = write_config(directory, upstream, backend=backend, redis_url=redis_url, workers=3)
    with fleet(config, "--workers", "2") as running:
        yield running


async def test_requests_are_served_by_both_workers_and_metrics_add_up(
        shared_fleet: Fleet) -> None:
    """--workers overrides the YAML; 40 requests land on both workers (two processes other than
    the supervisor); /metrics, from whichever worker answers, counts all 40."""
    assert shared_fleet.workers == 2
    pids = shared_fleet.worker_pids()
    assert set(pids) == {0, 1} and len(set(pids.values())) == 2
    assert shared_fleet.pid not in pids.values()
    # every worker on listen.event_loop's default, uvloop (its loop made after the fork)
    assert {e["event_loop"] for e in shared_fleet.log.events("proxy_started")} == {"uvloop"}
    session = f"spread-{uuid.uuid4().hex[:8]}"
    async with fresh_client() as client:
        assert await post_messages(client, shared_fleet.url, session, 40) == [200] * 40
        served = shared_fleet.served_by(count=40, session_id=session)
        assert len(served) == 40
        assert {worker for worker, _ in served} == {0, 1}
        assert set(served) == {(index, pid) for index, pid in pids.items()}
        for _ in range(4):  # each scrape may land on either worker: every one sums both
            async with client.get(f"{shared_fleet.url}/metrics") as response:
                text = await response.text()
            assert metric(text, "compact_proxy_requests_total", route="messages") == 40


async def test_racing_admin_writers_across_workers_have_one_winner_per_version(
        shared_fleet: Fleet) -> None:
    """12 concurrent PUTs from the same version, over both workers: exactly one wins each
    round (the others 409, or 428 for the creation), five rounds in a row."""
    sid = f"cas-{uuid.uuid4().hex[:8]}"
    path = f"{shared_fleet.url}/admin/sessions/{sid}/state"
    since = len(shared_fleet.log.events("request_completed", route="admin"))

    def body(writer: int, version: int) -> dict[str, Any]:
        return {"facts": [{"fact_id": "f1", "content": f"writer {writer} at {version}",
                           "source_pointer": f"transcript:{sid}:1",
                           "last_confirmed_at": "2025-03-01T12:30:00+00:00"}]}

    async def put(client: aiohttp.ClientSession, writer: int,
                  version: int | None) -> tuple[int, dict[str, Any]]:
        extra = {} if version is None else {"If-Match": f'"{version}"'}
        async with client.put(path, json=body(writer, version or 0),
                              headers={**AUTH, **extra}) as response:
            return response.status, await response.json()

    async with fresh_client() as client:
        version: int | None = None
        for round_number in range(5):
            results = await asyncio.gather(*(put(client, w, version) for w in range(12)))
            statuses = sorted(status for status, _ in results)
            loser = 428 if version is None else 409
            assert statuses == sorted([201 if version is None else 200] + [loser] * 11), (
                round_number, statuses)
            winner = next(answer for status, answer in results if status in (200, 201))
            assert winner["version"] == (version or 0) + 1
            for status, answer in results:
                if status == loser:
                    assert answer["type"] == "error"
                    assert answer["error"]["type"] in ("conflict_error",
                                                       "precondition_required_error",
                                                       "invalid_request_error")
            version = winner["version"]
            async with client.get(path, headers=AUTH) as response:
                stored = await response.json()
            assert stored["version"] == version
            assert stored["facts"] == winner["facts"]
    # 60 PUTs and 5 GETs
    writers = {worker for worker, _ in shared_fleet.served_by(since, 65, route="admin")}
    assert writers == {0, 1}


async def test_a_console_login_on_one_worker_is_valid_on_every_worker(
        shared_fleet: Fleet) -> None:
    """The login form, the login and 20 pages after it, each on a new connection: the cookie
    signed by one worker is accepted by both."""
    ui = f"{shared_fleet.url}/admin/ui"
    since = len(shared_fleet.log.events("request_completed"))
    async with fresh_client() as client:
        async with client.get(f"{ui}/login") as response:
            assert response.status == 200
            csrf = re.search(r'name="csrf" value="([^"]+)"', await response.text())
        assert csrf is not None
        async with client.post(f"{ui}/login", allow_redirects=False,
                               data={"csrf": csrf.group(1), "token": ADMIN_TOKEN,
                                     "next": "/admin/ui/"}) as response:
            assert response.status == 303
        statuses = []
        for _ in range(20):
            async with client.get(f"{ui}/", allow_redirects=False) as response:
                statuses.append(response.status)
    assert statuses == [200] * 20
    assert {worker for worker, _ in shared_fleet.served_by(since, 22)} == {0, 1}


async def test_a_console_logout_on_one_worker_is_refused_by_every_worker(
        shared_fleet: Fleet) -> None:
    """Issue #31: log in, log out, then 20 pages with the logged-out cookie, each on a new
    connection: every worker sends it back to the login form (the logout is in the store)."""
    ui = f"{shared_fleet.url}/admin/ui"
    async with fresh_client() as client:
        async with client.get(f"{ui}/login") as response:
            csrf = re.search(r'name="csrf" value="([^"]+)"', await response.text())
        assert csrf is not None
        async with client.post(f"{ui}/login", allow_redirects=False,
                               data={"csrf": csrf.group(1), "token": ADMIN_TOKEN}) as response:
            assert response.status == 303
        cookie = next(c.value for c in client.cookie_jar if c.key == "compact_console")
        async with client.get(f"{ui}/") as response:
            csrf = re.search(r'name="csrf" value="([^"]+)"', await response.text())
        assert csrf is not None
        async with client.post(f"{ui}/logout", allow_redirects=False,
                               data={"csrf": csrf.group(1)}) as response:
            assert response.status == 303
    since = len(shared_fleet.log.events("request_completed"))
    statuses = []
    async with fresh_client() as client:
        for _ in range(20):
            async with client.get(f"{ui}/", allow_redirects=False,
                                  headers={"Cookie": f"compact_console={cookie}"}) as response:
                statuses.append(response.status)
    assert statuses == [303] * 20
    assert {worker for worker, _ in shared_fleet.served_by(since, 20)} == {0, 1}


async def test_the_admin_listener_is_shared_by_the_workers(
        upstream: str, tmp_path: Path) -> None:
    """``admin.listen`` with port 0 under ``--workers 2``: one port, reserved by the
    supervisor (``workers_started`` names it), served by both workers; the main port answers
    /admin with 404."""
    config = write_config(tmp_path, upstream, backend="sqlite")
    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    data["admin"]["listen"] = {"port": 0}
    config.write_text(yaml.safe_dump(data), encoding="utf-8")
    with fleet(config, "--workers", "2") as running:
        started = running.log.events("workers_started")[0]
        admin_url = f"http://127.0.0.1:{started['admin_port']}"
        assert started["admin_port"] != running.port
        async with fresh_client() as client:
            statuses = []
            for _ in range(20):
                async with client.get(f"{admin_url}/admin/sessions", headers=AUTH) as response:
                    statuses.append(response.status)
            async with client.get(f"{running.url}/admin/sessions", headers=AUTH) as response:
                assert response.status == 404
        assert statuses == [200] * 20
        assert {worker for worker, _ in running.served_by(0, 21)} == {0, 1}


async def test_every_line_says_who_wrote_it_and_none_holds_a_credential(
        shared_fleet: Fleet) -> None:
    """Each JSON line carries the pid of the process that wrote it, a worker's also its index
    (the supervisor's lines name a worker only as what they are about); the API key and the
    admin token appear nowhere."""
    async with fresh_client() as client:
        assert await post_messages(client, shared_fleet.url, "workers-hygiene", 10) == [200] * 10
        async with client.get(f"{shared_fleet.url}/admin/sessions/workers-hygiene/state",
                              headers=AUTH) as response:
            assert response.status == 404
    shared_fleet.served_by(count=10, session_id="workers-hygiene")
    pids = set(shared_fleet.worker_pids().values())
    events = shared_fleet.log.events()
    assert {event["pid"] for event in events} == {shared_fleet.pid, *pids}
    for event in events:
        if event["pid"] != shared_fleet.pid:
            assert event["worker"] in (0, 1), event
        elif "worker" in event:
            assert event["event"].startswith("worker_"), event
    with shared_fleet.log._lock:
        lines = list(shared_fleet.log.lines)
    assert not [line for line in lines if API_KEY in line or ADMIN_TOKEN in line]


# -- a fleet of its own: kill, stop ---------------------------------------------------------------
