"""Reliability fixtures: proxies and fake providers started as real subprocesses, the stderr
of each proxy kept by the run's log tap (``tests/log_tap.py``), which checks it for secrets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

# (the credentials and the tap are imported from here by the reliability tests)
from tests.conftest import LOAD_API_KEY, RELIABILITY_ADMIN_TOKEN, SECRETS  # noqa: F401
from tests.log_tap import LOG_TAP

REPO: Final = Path(__file__).resolve().parents[2]
PYTHON: Final = sys.executable


# -- processes ----------------------------------------------------------------------------


@dataclass
class ServiceProcess:
    """A proxy or fake provider running as a subprocess of the test."""

    process: subprocess.Popen[bytes]
    base_url: str
    stderr_lines: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        """The process id (for ``/proc/<pid>/...``)."""
        return self.process.pid

    def status(self, key: str) -> int:
        """A ``kB`` figure of ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``), in bytes."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
        raise KeyError(key)

    def open_fds(self) -> int:
        """How many file descriptors the process holds."""
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def stop(self) -> None:
        """SIGTERM, then wait (SIGKILL if it does not exit)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def _pump(stream: Any, sink: list[str], tap: bool, ready: Callable[[str], None]) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip("\n")
        sink.append(line)
        if tap:
            LOG_TAP.add(line)
        ready(line)


def _spawn(argv: list[str], *, env: Mapping[str, str], find_url: Callable[[str], str | None],
           tap_stream: str, timeout_s: float = 20.0) -> ServiceProcess:
    process = subprocess.Popen(argv, cwd=REPO, env={**os.environ, **env},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    found: list[str] = []
    event = threading.Event()

    def ready(line: str) -> None:
        url = find_url(line)
        if url is not None and not found:
            found.append(url)
            event.set()

    stdout_lines: list[str] = []
    stderr_lines: list[str] = []
    for name, stream, sink in (("stdout", process.stdout, stdout_lines),
                               ("stderr", process.stderr, stderr_lines)):
        threading.Thread(target=_pump, args=(stream, sink, name == tap_stream, ready),
                         daemon=True).start()
    if not event.wait(timeout_s):
        process.kill()
        process.wait()
        raise RuntimeError(f"{argv[2:]} did not start: {stderr_lines[-5:]} {stdout_lines[-5:]}")
    return ServiceProcess(process, found[0], stderr_lines)


def _proxy_url(line: str) -> str | None:
    try:
        event = json.loads(line)
    except ValueError:
        return None
    if isinstance(event, dict) and event.get("event") == "proxy_started":
        return f"http://127.0.0.1:{event['port']}"
    return None


def _upstream_url(line: str) -> str | None:
    prefix = "fake upstream listening on "
    return line[len(prefix):].strip() if line.startswith(prefix) else None


ProxyProcessFactory = Callable[..., ServiceProcess]


@pytest.fixture
def proxy_process(tmp_path: Path) -> Iterator[ProxyProcessFactory]:
    """Start ``compact-proxy serve`` subprocesses: ``proxy_process(upstream_url, config_overrides,
    admin_token=...)``; JSON logs on stderr go to the session's log tap."""
    started: list[ServiceProcess] = []

    def start(upstream_url: str, overrides: Mapping[str, Any] | None = None, *,
              admin_token: str | None = None) -> ServiceProcess:
        from tests.conftest import deep_merge

        state_dir = tmp_path / f"proc-proxy{len(started)}"
        (state_dir / "transcripts").mkdir(parents=True, exist_ok=True)
        (state_dir / "artifacts").mkdir(parents=True, exist_ok=True)
        mapping = deep_merge({
            "listen": {"host": "127.0.0.1", "port": 0},
            "upstream": {"base_url": upstream_url, "connect_timeout_s": 5, "read_timeout_s": 30},
            "compaction": {"token_counter": "chars4"},
            "summary": {"enabled": False},
            "store": {"path": str(state_dir / "state.db")},
            "sources": {"transcript_root": str(state_dir / "transcripts"),
                        "artifact_root": str(state_dir / "artifacts")},
            "admin": {"token_env": "COMPACT_PROXY_RELIABILITY_ADMIN_TOKEN"},
            "logging": {"format": "json", "level": "info"},
        }, overrides or {})
        config_path = state_dir / "config.yaml"
        config_path.write_text(yaml.safe_dump(mapping), encoding="utf-8")
        env = {"COMPACT_PROXY_RELIABILITY_ADMIN_TOKEN": admin_token or ""}
        service = _spawn([PYTHON, "-m", "proxy.cli", "serve", "--config", str(config_path)],
                         env=env, find_url=_proxy_url, tap_stream="stderr")
        started.append(service)
        return service

    try:
        yield start
    finally:
        for service in reversed(started):
            service.stop()


@pytest.fixture
def upstream_process() -> Iterator[Callable[..., ServiceProcess]]:
    """Start fake providers as subprocesses: ``upstream_process(event_delay_s=0.02)``."""
    started: list[ServiceProcess] = []

    def start(event_delay_s: float = 0.0) -> ServiceProcess:
        service = _spawn([PYTHON, "-m", "tests.reliability.upstream_process",
                          "--event-delay", str(event_delay_s)],
                         env={}, find_url=_upstream_url, tap_stream="stderr")
        started.append(service)
        return service

    try:
        yield start
    finally:
        for service in reversed(started):
            service.stop()


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0,
               interval_s: float = 0.02) -> bool:
    """Poll ``predicate`` until it holds or ``timeout_s`` passes; its last answer."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()
