"""``compact-proxy serve --workers N``, run as the real processes: the supervisor, its forked
workers sharing one port (``SO_REUSEPORT``), the stamped fake provider in a process of its own,
and the store (a SQLite file, or a real ``redis-server``).

Which worker served a request is read from its ``request_completed`` log line, which carries
``worker`` (the index) and ``pid``. Requests go over a fresh connection each, so the kernel
spreads them over the workers (40 requests all on one of two workers: odds 2**-39).
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from proxy.http.tenants import NO_TENANT
from proxy.server.workers import BACKOFF_FIRST_S, BACKOFF_MAX_S, backoff_s
from proxy.store import SQLiteStateStore
from tests.redis_server import free_port

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
_SCRIPT = shutil.which("compact-proxy")
COMMAND = [_SCRIPT] if _SCRIPT else [sys.executable, "-m", "proxy.cli"]
ADMIN_ENV = "COMPACT_PROXY_WORKERS_TEST_ADMIN_TOKEN"
ADMIN_TOKEN = "workers-admin-token-3d9e7a51c2b4f6e8a0"
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
API_KEY = "sk-ant-api03-workers-test-key-00112233445566"
#: The stamped fake provider's header: milliseconds between two SSE events of the reply.
DELAY_HEADER = "x-bench-event-delay-ms"
#: A fleet has this long to start (the supervisor imports the app once; a loaded CI box).
START_TIMEOUT_S = 40.0


# -- processes ----------------------------------------------------------------------------------


class Logged:
    """A subprocess whose output lines are kept (JSON lines parsed) as they arrive."""

    def __init__(self, argv: list[str], *, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            argv, cwd=REPO, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        for stream in (self.process.stdout, self.process.stderr):
            threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: Any) -> None:
        for raw in iter(stream.readline, b""):
            with self._changed:
                self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
                self._changed.notify_all()

    def events(self, name: str | None = None, **fields: Any) -> list[dict[str, Any]]:
        """The JSON events logged so far (of ``name``, with these field values)."""
        with self._lock:
            lines = list(self.lines)
        out = []
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if (isinstance(event, dict) and (name is None or event.get("event") == name)
                    and all(event.get(k) == v for k, v in fields.items())):
                out.append(event)
        return out

    def wait_for(self, name: str, timeout_s: float = 15.0, count: int = 1, *,
                 after_exit: bool = False, **fields: Any) -> list[dict[str, Any]]:
        """Wait until ``count`` events ``name`` (with these fields) were logged (giving up
        when the process exits, unless ``after_exit``: its children may still write)."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                self._lock.release()
                try:
                    found = self.events(name, **fields)
                finally:
                    self._lock.acquire()
                if len(found) >= count:
                    return found
                left = deadline - time.monotonic()
                if left <= 0 or (not after_exit and self.process.poll() is not None):
                    break
                self._changed.wait(min(left, 0.2))
        raise AssertionError(f"no {count} {name} {fields} within {timeout_s}s (exit "
                             f"{self.process.poll()}); last lines: {self.lines[-8:]}")

    def stop(self) -> int:
        """SIGTERM, then SIGKILL if it is still running after 30 s; the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    """The stamped fake provider (``bench/stamped_upstream.py``: the strict fake provider,
    whose events a request header can slow down) in its own process; its base URL."""
    process = Logged([sys.executable, "-m", "bench.stamped_upstream", "--port", str(free_port())])
    try:
        url = process.wait_for("listening", timeout_s=START_TIMEOUT_S)[0]["url"]
        yield str(url)
    finally:
        process.stop()


def write_config(directory: Path, upstream_url: str, *, backend: str, redis_url: str = "",
                 **listen: Any) -> Path:
    """A ``serve`` config with everything under ``directory``."""
    (directory / "transcripts").mkdir(parents=True, exist_ok=True)
    (directory / "artifacts").mkdir(parents=True, exist_ok=True)
    store: dict[str, Any] = {"backend": backend, "path": str(directory / "state.db")}
    if backend == "redis":
        store["url"] = redis_url
    config = {
        "listen": {"host": "127.0.0.1", "port": 0, **listen},
        "upstream": {"base_url": upstream_url, "connect_timeout_s": 5, "read_timeout_s": 30},
        "compaction": {"token_counter": "chars4"},
        "summary": {"enabled": False},
        "store": store,
        "sources": {"transcript_root": str(directory / "transcripts"),
                    "artifact_root": str(directory / "artifacts")},
        "admin": {"token_env": ADMIN_ENV},
        "logging": {"format": "json", "level": "info"},
    }
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


class Fleet:
    """A running ``compact-proxy serve --workers N``."""

    def __init__(self, process: Logged, config: Path) -> None:
        self.log = process
        self.config = config
        started = process.wait_for("workers_started", timeout_s=START_TIMEOUT_S)[0]
        self.workers = int(started["workers"])
        self.url = f"http://127.0.0.1:{started['port']}"
        self.port = int(started["port"])

    @property
    def pid(self) -> int:
        """The supervisor's process id."""
        return self.log.process.pid

    def worker_pids(self) -> dict[int, int]:
        """Each worker index -> the pid of its latest process (from ``proxy_started``)."""
        return {int(e["worker"]): int(e["pid"]) for e in self.log.events("proxy_started")}

    def served_by(self, since: int = 0, count: int = 0, **fields: Any) -> list[tuple[int, int]]:
        """(worker, pid) of the ``request_completed`` lines (with ``fields``) after the
        ``since``-th, once there are at least ``count`` of them (a line is written after its
        answer, so it may come a moment after the client got the answer)."""
        if count:
            self.log.wait_for("request_completed", count=since + count, **fields)
        return [(int(e["worker"]), int(e["pid"]))
                for e in self.log.events("request_completed", **fields)[since:]]


@contextmanager
def fleet(config: Path, *args: str, **env: str) -> Iterator[Fleet]:
    """Start ``serve --config config *args`` and wait until every worker serves."""
    process = Logged([*COMMAND, "serve", "--config", str(config), *args],
                     env={ADMIN_ENV: ADMIN_TOKEN, **env})
    try:
        yield Fleet(process, config)
    finally:
        process.stop()


def fresh_client() -> aiohttp.ClientSession:
    """A client that opens a new connection for every request (so requests spread)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(force_close=True, limit=0),
        cookie_jar=aiohttp.CookieJar(unsafe=True),
        timeout=aiohttp.ClientTimeout(total=30))


def message_body(text: str = "hello", *, stream: bool = False) -> dict[str, Any]:
    """A small valid Messages request."""
    return {"model": "claude-sonnet-4-5", "max_tokens": 64, "stream": stream,
            "messages": [{"role": "user", "content": text}]}


def headers(session_id: str, **extra: str) -> dict[str, str]:
    """What a client sends with a Messages request."""
    return {"x-api-key": API_KEY, "anthropic-version": "2023-06-01",
            "x-compact-session-id": session_id, **extra}


async def post_messages(client: aiohttp.ClientSession, url: str, session_id: str,
                        count: int) -> list[int]:
    """``count`` concurrent small requests; their statuses."""
    async def one(number: int) -> int:
        async with client.post(f"{url}/v1/messages", json=message_body(f"hello {number}"),
                               headers=headers(session_id)) as response:
            await response.read()
            return response.status

    return list(await asyncio.gather(*(one(n) for n in range(count))))


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples ``name`` having these labels in a Prometheus text exposition."""
    total = 0.0
    for line in text.splitlines():
        sample, _, value = line.rpartition(" ")
        found, _, rest = sample.partition("{")
        pairs = dict(re.findall(r'(\w+)="([^"]*)"', rest))
        if found == name and labels.items() <= pairs.items():
            total += float(value)
    return total


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


async def test_a_worker_killed_with_sigkill_is_restarted_and_the_port_keeps_answering(
        upstream: str, tmp_path: Path) -> None:
    """SIGKILL on worker 0: logged with its index, pid and signal; the port answers at once
    (worker 1), and a new worker 0 serves again soon after."""
    with fleet(write_config(tmp_path, upstream, backend="sqlite"), "--workers", "2") as running:
        victim = running.worker_pids()[0]
        os.kill(victim, signal.SIGKILL)
        exited = running.log.wait_for("worker_exited", worker=0)[0]
        assert (exited["worker_pid"], exited["signal"], exited["exit_code"]) == (
            victim, "SIGKILL", None)
        assert exited["restart_in_s"] == BACKOFF_FIRST_S
        async with fresh_client() as client:
            for _ in range(20):  # the survivor answers while worker 0 is away
                async with client.get(f"{running.url}/healthz") as response:
                    assert response.status == 200
            running.log.wait_for("proxy_started", count=3)
            reborn = running.worker_pids()[0]
            assert reborn != victim
            session = "after-restart"
            for sent in range(4, 44, 4):
                assert await post_messages(client, running.url, session, 4) == [200] * 4
                if (0, reborn) in running.served_by(count=sent, session_id=session):
                    break
            assert (0, reborn) in running.served_by(session_id=session)
        assert running.log.process.poll() is None
    assert running.log.process.returncode == 0


async def test_workers_stop_when_their_supervisor_is_killed(upstream: str,
                                                             tmp_path: Path) -> None:
    """SIGKILL on the supervisor: each worker sees its lifeline close, logs
    ``supervisor_gone``, stops like on SIGTERM, and the port refuses connections."""
    # A supervisor killed leaves its metrics directory behind: here, in the test's directory.
    with fleet(write_config(tmp_path, upstream, backend="sqlite"), "--workers", "2",
               TMPDIR=str(tmp_path)) as running:
        workers = running.worker_pids()
        os.kill(running.pid, signal.SIGKILL)
        gone = running.log.wait_for("supervisor_gone", count=2, after_exit=True)
        assert sorted(event["worker"] for event in gone) == [0, 1]
        running.log.wait_for("proxy_stopped", count=2, after_exit=True)
        deadline = time.monotonic() + 15.0
        while any(_alive(pid) for pid in workers.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not [pid for pid in workers.values() if _alive(pid)]
        assert await _refused_within(running.port, 1.0)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its new parent to reap it does not)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


async def test_sigterm_lets_a_slow_stream_finish_then_the_supervisor_exits_0(
        upstream: str, tmp_path: Path) -> None:
    """A stream paced at 250 ms per event is in flight when the supervisor gets SIGTERM: the
    port stops accepting, the stream goes on to its last event, every worker exits 0, then the
    supervisor does; the usage ledger and the audit log hold every request exactly once."""
    config = write_config(tmp_path, upstream, backend="sqlite")
    with fleet(config, "--workers", "2") as running:
        session = "drained"
        async with fresh_client() as client:
            assert await post_messages(client, running.url, session, 10) == [200] * 10
            async with client.post(f"{running.url}/v1/messages",
                                   json=message_body("slow", stream=True),
                                   headers=headers(session, **{DELAY_HEADER: "250"})
                                   ) as response:
                assert response.status == 200
                received = bytearray(await response.content.readany())
                os.kill(running.pid, signal.SIGTERM)
                running.log.wait_for("workers_stopping")
                refused = await _refused_within(running.port, 3.0)
                async for chunk in response.content.iter_any():
                    received += chunk
            assert refused, "the port still accepted connections while draining"
        events = [line[len("event: "):] for line in received.decode().splitlines()
                  if line.startswith("event: ")]
        assert events[0] == "message_start" and events[-1] == "message_stop"
        assert "content_block_delta" in events
        assert running.log.process.wait(30) == 0
        stopped = running.log.events("worker_stopped")
        assert sorted(e["worker"] for e in stopped) == [0, 1]
        assert all(e["exit_code"] == 0 for e in stopped)
        assert running.log.events("workers_stopped")[0]["exit_code"] == 0
    usage, (entries, total) = await _ledger_and_audit(config, session)
    assert usage == 11
    assert total == 11 and len({entry.request_id for entry in entries}) == 11


async def test_the_drain_is_bounded_by_listen_drain_timeout_s(upstream: str,
                                                                tmp_path: Path) -> None:
    """A stream paced at 1 s per event outlives ``drain_timeout_s: 1``: on SIGINT it is cut,
    and the supervisor still exits 0 within the timeout and a margin, not at the stream's
    end."""
    config = write_config(tmp_path, upstream, backend="sqlite", drain_timeout_s=1)
    with fleet(config, "--workers", "2") as running:
        async with fresh_client() as client:
            async with client.post(f"{running.url}/v1/messages",
                                   json=message_body("slow", stream=True),
                                   headers=headers("cut", **{DELAY_HEADER: "1000"})
                                   ) as response:
                assert response.status == 200
                received = bytearray(await response.content.readany())
                os.kill(running.pid, signal.SIGINT)  # as SIGTERM (Ctrl-C)
                stopped_at = time.monotonic()
                with suppress(aiohttp.ClientPayloadError):
                    async for chunk in response.content.iter_any():
                        received += chunk
        assert running.log.process.wait(30) == 0
        took = time.monotonic() - stopped_at
    assert b"event: message_stop" not in received
    assert took < 6.0, f"the supervisor took {took:.1f}s to stop with a 1 s drain timeout"


async def _ledger_and_audit(config: Path, session: str) -> tuple[int, tuple[list[Any], int]]:
    """The requests the usage ledger counted for ``session``, and its audit entries (and
    how many there are), read from the fleet's SQLite file."""
    store = SQLiteStateStore(yaml.safe_load(config.read_text())["store"]["path"])
    await store.open()
    try:
        rows = await store.usage_rows()
        audit = await store.session_requests(NO_TENANT, session, limit=100)
    finally:
        await store.close()
    return sum(row.entry.requests for row in rows
               if row.session_key.rpartition("/")[2] == session), audit


async def _refused_within(port: int, timeout_s: float) -> bool:
    """Whether a new connection to the port is refused within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return True
        writer.close()
        with suppress(OSError):
            await writer.wait_closed()
        await asyncio.sleep(0.05)
    return False


# -- starting: failures, and one worker -----------------------------------------------------------


def test_a_taken_port_fails_the_start_with_exit_2_and_starts_no_worker(
        upstream: str, tmp_path: Path) -> None:
    """The supervisor binds the port before it forks: a port in use is one line, exit 2."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = write_config(tmp_path, upstream, backend="sqlite", port=port)
        done = subprocess.run([*COMMAND, "serve", "--config", str(config), "--workers", "2"],
                              cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if not line.startswith("{")]
    assert lines == [f"config error: listen.port: cannot listen on 127.0.0.1:{port}: "
                     "Address already in use"]
    assert "worker_started" not in done.stderr


def test_an_unusable_store_fails_the_start_with_exit_2(upstream: str, tmp_path: Path) -> None:
    """The supervisor opens the store once before it forks: a directory as the SQLite file is
    one line naming store.path, exit 2, no worker."""
    config = write_config(tmp_path, upstream, backend="sqlite")
    data = yaml.safe_load(config.read_text())
    data["store"]["path"] = str(tmp_path)  # a directory
    config.write_text(yaml.safe_dump(data))
    done = subprocess.run([*COMMAND, "serve", "--config", str(config), "--workers", "2"],
                          cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert [line for line in done.stderr.splitlines() if not line.startswith("{")][0].startswith(
        "config error: store.path: cannot open the state store")
    assert "worker_started" not in done.stderr


@pytest.mark.parametrize(("args", "problem"), [
    (["--workers", "0"], "not an integer >= 1"),
    (["--workers", "two"], "not an integer >= 0"),
    (["--workers", "257"], "must be between 1 and 256"),
])
def test_bad_worker_counts_are_refused(upstream: str, tmp_path: Path, args: list[str],
                                       problem: str) -> None:
    """--workers takes an integer from 1 to 256; anything else is exit 2 naming it."""
    config = write_config(tmp_path, upstream, backend="sqlite")
    done = subprocess.run([*COMMAND, "serve", "--config", str(config), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert problem in done.stderr and "--workers" in done.stderr


async def test_one_worker_serves_in_the_serve_process_itself(upstream: str,
                                                              tmp_path: Path) -> None:
    """listen.workers 1 (the default): no child process, no supervisor, no worker field."""
    config = write_config(tmp_path, upstream, backend="sqlite")
    process = Logged([*COMMAND, "serve", "--config", str(config)], env={ADMIN_ENV: ""})
    try:
        started = process.wait_for("proxy_started", timeout_s=START_TIMEOUT_S)[0]
        assert "worker" not in started and "pid" not in started
        # glibc's thresholds fixed at startup (proxy.server.allocator), said in the startup line
        assert started["allocator"] == ("fixed" if platform.libc_ver()[0] == "glibc"
                                        else "not_glibc")
        assert started["event_loop"] == "uvloop"  # listen.event_loop's default
        children = Path(f"/proc/{process.process.pid}/task/{process.process.pid}/children")
        assert children.read_text().split() == []
        async with fresh_client() as client:
            async with client.get(f"http://127.0.0.1:{started['port']}/healthz") as response:
                assert response.status == 200
        assert process.events("workers_started") == []
    finally:
        assert process.stop() == 0


@pytest.mark.parametrize("workers", [1, 2])
async def test_listen_event_loop_asyncio_serves_on_the_standard_library_loop(
        upstream: str, tmp_path: Path, workers: int) -> None:
    """listen.event_loop: asyncio runs every serving process on asyncio's own loop (the
    default, uvloop, is checked above and in every worker below) and serves the same."""
    config = write_config(tmp_path, upstream, backend="sqlite", event_loop="asyncio",
                          workers=workers)
    process = Logged([*COMMAND, "serve", "--config", str(config)], env={ADMIN_ENV: ""})
    try:
        started = process.wait_for("proxy_started", count=workers, timeout_s=START_TIMEOUT_S)
        assert [line["event_loop"] for line in started] == ["asyncio"] * workers
        async with fresh_client() as client:
            async with client.post(f"http://127.0.0.1:{started[0]['port']}/v1/messages",
                                   json=message_body(stream=True),
                                   headers=headers("loop-asyncio")) as response:
                assert response.status == 200
                assert b"event: message_stop" in await response.read()
    finally:
        assert process.stop() == 0


def test_backoff_doubles_per_quick_death_up_to_its_maximum() -> None:
    """0.25 s, 0.5 s, 1 s... never above the maximum."""
    assert [backoff_s(n) for n in (1, 2, 3)] == [BACKOFF_FIRST_S, 2 * BACKOFF_FIRST_S,
                                                 4 * BACKOFF_FIRST_S]
    assert backoff_s(50) == BACKOFF_MAX_S
