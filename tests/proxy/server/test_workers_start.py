"""``serve`` starting: refused ports, stores and worker counts, one worker, the event loop."""

from __future__ import annotations

import platform
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from proxy.server.workers import BACKOFF_FIRST_S, BACKOFF_MAX_S, backoff_s
from tests.proxy.server.workers_fleet import (
    ADMIN_ENV,
    COMMAND,
    REPO,
    START_TIMEOUT_S,
    Logged,
    fresh_client,
    headers,
    message_body,
    write_config,
)

pytestmark = pytest.mark.slow


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
