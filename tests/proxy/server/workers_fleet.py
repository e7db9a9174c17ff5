"""Helpers of the ``serve --workers N`` tests, which run the real processes: the supervisor,
its forked workers sharing one port (``SO_REUSEPORT``), the stamped fake provider in a process
of its own, and the store (a SQLite file, or a real ``redis-server``).

Which worker served a request is read from its ``request_completed`` log line, which carries
``worker`` (the index) and ``pid``. Requests go over a fresh connection each, so the kernel
spreads them over the workers (40 requests all on one of two workers: odds 2**-39).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import yaml

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
