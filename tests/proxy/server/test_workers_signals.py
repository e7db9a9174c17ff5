"""``serve --workers 2`` under signals: a worker or the supervisor killed, SIGTERM's drain."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from proxy.http.tenants import NO_TENANT
from proxy.server.workers import BACKOFF_FIRST_S
from proxy.store import SQLiteStateStore
from tests.proxy.server.workers_fleet import (
    DELAY_HEADER,
    fleet,
    fresh_client,
    headers,
    message_body,
    post_messages,
    write_config,
)

pytestmark = pytest.mark.slow


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
