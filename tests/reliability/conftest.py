"""Reliability fixtures: a tap on every log line the proxy renders during the whole pytest
session, and proxies / fake providers started as real subprocesses.

The log tap
-----------
Every line the proxy logs, through structlog or the standard ``logging`` module, is rendered
by a structlog ``JSONRenderer`` or ``ConsoleRenderer`` as the last step of the chain that
:func:`proxy.logs.configure_logging` builds (after the redactor). :func:`pytest_configure`
wraps both renderers' ``__call__`` so that each rendered line is also kept in
:data:`LOG_TAP`, whichever stream it goes to; the stderr of every proxy subprocess started
here is added to it as well. Pytest loads this file while collecting, before any test runs, so
the tap sees every test of the session, in every directory. :func:`pytest_sessionfinish` then
scans it for the secrets of :data:`SECRETS` and fails the run on any hit, or when it holds
fewer lines than tests that ran a proxy (each request logs at least ``request_completed``), so
a tap that saw nothing cannot pass.
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
import structlog
import yaml

from tests.conftest import PROMPT_MARKER, TEST_API_KEY

REPO: Final = Path(__file__).resolve().parents[2]
PYTHON: Final = sys.executable
#: The admin token the reliability tests use; also sent as a bearer token.
RELIABILITY_ADMIN_TOKEN: Final = "reliability-admin-token-4e1f9a27c3b8"
#: A second credential: the key subprocess load clients send.
LOAD_API_KEY: Final = "sk-ant-api03-reliability-load-key-77aa11bb22cc"

#: What no log line of the session may contain: the test API keys, every admin (bearer)
#: token the suite uses, and the marker placed in every e2e prompt.
SECRETS: Final[tuple[str, ...]] = (
    TEST_API_KEY,
    LOAD_API_KEY,
    PROMPT_MARKER,
    RELIABILITY_ADMIN_TOKEN,
    f"Bearer {RELIABILITY_ADMIN_TOKEN}",
    "admin-hygiene-token-9c1e5b2d",
    "admin-e2e-token-5b2d4e6f",
    "admin-e2e-token-merge-9c1d",
    "tok-7f3a9c1e5b2d4e6f8a0b",
)
#: Tests that run a proxy: each of them must leave at least one line in the tap.
_PROXY_TEST_DIRS: Final = ("tests/proxy/test_e2e_", "tests/reliability/test_provider",
                           "tests/reliability/test_client", "tests/reliability/test_load")


class LogTap:
    """Every log line rendered in this process (and by our subprocesses), kept in order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.lines: list[str] = []

    def add(self, line: str) -> None:
        """Keep one rendered line."""
        with self._lock:
            self.lines.append(line)

    def hits(self) -> list[tuple[int, str]]:
        """``(line number, secret)`` for every secret found in a kept line."""
        with self._lock:
            lines = list(self.lines)
        return [(number, secret) for number, line in enumerate(lines)
                for secret in SECRETS if secret in line]

    def __len__(self) -> int:
        with self._lock:
            return len(self.lines)


LOG_TAP: Final = LogTap()
_ORIGINALS: dict[type, Callable[..., Any]] = {}


def _tapped(original: Callable[..., Any]) -> Callable[..., Any]:
    def render(self: Any, logger: Any, name: str, event_dict: Any) -> Any:
        out = original(self, logger, name, event_dict)
        LOG_TAP.add(out.decode("utf-8", "replace") if isinstance(out, bytes) else str(out))
        return out

    return render


def pytest_configure(config: pytest.Config) -> None:
    """Install the tap on both renderers (once)."""
    for renderer in (structlog.processors.JSONRenderer, structlog.dev.ConsoleRenderer):
        if renderer not in _ORIGINALS:
            _ORIGINALS[renderer] = renderer.__call__
            renderer.__call__ = _tapped(renderer.__call__)  # type: ignore[method-assign]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if any log line held a secret, or if a full run scanned too few lines."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    hits = LOG_TAP.hits()
    # Every e2e or reliability test talks to a proxy, and every request writes at least its
    # request_completed line: fewer lines than such tests means the tap saw nothing.
    minimum = sum(1 for item in session.items if item.nodeid.startswith(_PROXY_TEST_DIRS))
    problems: list[str] = []
    if hits:
        shown = ", ".join(f"line {number} holds {secret[:6]}..." for number, secret in hits[:5])
        problems.append(f"{len(hits)} secret(s) found in proxy log lines: {shown}")
    if len(LOG_TAP) < minimum:
        problems.append(f"only {len(LOG_TAP)} proxy log lines were scanned for {minimum} "
                        "tests that ran a proxy: the log tap is broken")
    if reporter is not None:
        reporter.write_line(f"log hygiene: scanned {len(LOG_TAP)} proxy log lines of the "
                            f"session for {len(SECRETS)} secrets: {len(hits)} hits")
        for problem in problems:
            reporter.write_line(f"LOG HYGIENE FAILED: {problem}", red=True)
    if problems:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


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
