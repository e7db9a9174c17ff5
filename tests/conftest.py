"""Shared fixtures: a real fake upstream and a real proxy on 127.0.0.1 (port 0), both served by
an event loop in a background thread, so the sync ``anthropic.Anthropic`` client (which blocks
the test's thread) and the ``AsyncAnthropic`` client (on the test's own loop) both work.

Every proxy started here logs, as JSON lines, into one file per test session (per xdist
worker: :func:`proxy_log`), which the log-hygiene test scans for the API key and the prompt
marker; every line any proxy renders in the run is also kept by the log tap
(``tests/log_tap.py``), which the hooks below check for :data:`SECRETS` at the end of the run.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import threading
from collections.abc import Callable, Coroutine, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, TypeVar

import anthropic
import pytest
from aiohttp import web

from proxy.config import Config
from proxy.fake_upstream import FakeUpstream, start_fake_upstream
from proxy.http.keys import SERVICES
from proxy.server.app import start_proxy
from proxy.telemetry.logs import configure_logging, reset_logging
from tests.log_tap import LOG_TAP, TapSummary, install
from tests.paths import CORPUS

#: The API key every e2e test sends; it must never appear in a log line.
TEST_API_KEY = "sk-ant-api03-e2e-test-key-0123456789abcdef"
#: Placed in every e2e prompt; it must never appear in a log line either.
PROMPT_MARKER = "PROMPT-MARKER-7f3a9c"
#: The environment variable e2e tests put the admin token in.
ADMIN_TOKEN_ENV = "COMPACT_PROXY_E2E_ADMIN_TOKEN"
#: The admin token the reliability tests use; also sent as a bearer token.
RELIABILITY_ADMIN_TOKEN = "reliability-admin-token-4e1f9a27c3b8"
#: A second credential: the key subprocess load clients send.
LOAD_API_KEY = "sk-ant-api03-reliability-load-key-77aa11bb22cc"

#: What no log line of the run may contain: the test API keys, every admin (bearer) token the
#: suite uses, and the marker placed in every e2e prompt.
SECRETS: tuple[str, ...] = (
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
_PROXY_TEST_FILES = ("tests/proxy/test_e2e_", "tests/reliability/test_provider",
                     "tests/reliability/test_client", "tests/reliability/test_load")
#: The run's tapped lines (this process's, and every xdist worker's), and its proxy tests.
_RUN_TAP = TapSummary()
_RUN_PROXY_TESTS = [0]

T = TypeVar("T")


def pytest_configure(config: pytest.Config) -> None:
    """Tap every log line rendered in this process (an xdist worker's or the run's own)."""
    LOG_TAP.secrets = SECRETS
    install()


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker more than the cores. Most tests spend part of their time
    waiting for the processes they start (the proxy, the fake provider, Redis, a browser):
    the extra worker runs meanwhile."""
    return (os.cpu_count() or 1) + 1


#: The markers of a file that runs for seconds: such files start first (see below).
_LONG_MARKERS = ("slow", "browser")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files with a slow or browser test first, each file's tests in their order: under
    ``--dist loadfile`` (``--no-loadscope-reorder``) a worker takes the next file as it frees,
    so the long files start early and the short ones fill the end of the run on every core."""
    long_files = {item.path for item in items
                  if any(item.get_closest_marker(name) for name in _LONG_MARKERS)}
    items.sort(key=lambda item: item.path not in long_files)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Count the tests that ran a proxy (on the controller, from the workers' reports)."""
    if report.when == "call" and report.nodeid.startswith(_PROXY_TEST_FILES):
        _RUN_PROXY_TESTS[0] += 1


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """Add up the tap of an xdist worker that finished."""
    summary = getattr(node, "workeroutput", {}).get("log_tap")
    if summary is not None:
        _RUN_TAP.add(summary)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if any log line held a secret, or if it scanned too few lines. An xdist
    worker sends its tap to the controller instead, which judges the whole run."""
    config = session.config
    if hasattr(config, "workerinput"):
        config.workeroutput["log_tap"] = LOG_TAP.summary().as_dict()  # type: ignore[attr-defined]
        return
    _RUN_TAP.add(LOG_TAP.summary())
    problems = _RUN_TAP.problems(_RUN_PROXY_TESTS[0])
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"log hygiene: scanned {_RUN_TAP.lines} proxy log lines of the run "
                            f"for {len(SECRETS)} secrets: {len(_RUN_TAP.hits)} hits")
        for problem in problems:
            reporter.write_line(f"LOG HYGIENE FAILED: {problem}", red=True)
    if problems:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


class LoopThread:
    """An asyncio loop running forever in a daemon thread; :meth:`run` executes a coroutine on
    it and waits for the result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="servers", daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Schedule ``coro`` on the loop without waiting."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        """Run ``coro`` on the loop and return its result."""
        return self.submit(coro).result(timeout)

    def close(self) -> None:
        """Stop the loop and join the thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


@dataclass
class UpstreamServer:
    """A running fake upstream: its state (requests, queue, counters) and its base URL."""

    upstream: FakeUpstream
    base_url: str
    port: int


@dataclass
class RunningProxy:
    """A running proxy: its base URL, config and the directories it uses."""

    base_url: str
    config: Config
    state_dir: Path
    transcript_root: Path
    artifact_root: Path
    admin_token: str | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    #: The proxy's application (its caches, read by tests of what a request leaves behind).
    app: web.Application | None = None


def deep_merge(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` merged in, section by section."""
    out = copy.deepcopy(dict(base))
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_corpus_body(name: str) -> dict[str, Any]:
    """One corpus conversation (``../shared/corpus/real/<name>``) as a request body."""
    body: dict[str, Any] = json.loads((CORPUS / name).read_text(encoding="utf-8"))
    return body


def user_text(text: str = "") -> str:
    """A prompt text carrying :data:`PROMPT_MARKER`."""
    return f"{PROMPT_MARKER} {text}".strip()


@pytest.fixture(scope="session")
def servers() -> Iterator[LoopThread]:
    """The background loop that serves every fake upstream and proxy of the session."""
    loop = LoopThread()
    try:
        yield loop
    finally:
        loop.close()


@pytest.fixture(scope="session")
def proxy_log_stream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TextIO]:
    """The file every proxy of this session logs into (JSON lines), open all session long."""
    path = tmp_path_factory.mktemp("logs") / "proxy.jsonl"
    handle = path.open("a", encoding="utf-8", buffering=1)
    try:
        yield handle
    finally:
        handle.close()


@pytest.fixture
def proxy_log(proxy_log_stream: TextIO) -> Path:
    """The path of the session's proxy log."""
    return Path(proxy_log_stream.name)


def read_log(path: Path) -> list[dict[str, Any]]:
    """Every JSON line of the proxy log so far."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def log_lines_for(path: Path, request_id: str) -> list[dict[str, Any]]:
    """The log lines of one request."""
    return [line for line in read_log(path) if line.get("request_id") == request_id]


@pytest.fixture
def upstream_server(servers: LoopThread) -> Iterator[UpstreamServer]:
    """A fresh fake upstream (default script) on a free loopback port."""
    upstream = FakeUpstream()
    runner, url = servers.run(start_fake_upstream(upstream))
    try:
        yield UpstreamServer(upstream, url, int(url.rsplit(":", 1)[1]))
    finally:
        servers.run(runner.cleanup())


ProxyFactory = Callable[..., RunningProxy]


@pytest.fixture
def proxy_factory(
    servers: LoopThread, upstream_server: UpstreamServer, proxy_log_stream: TextIO,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> Iterator[ProxyFactory]:
    """Start proxies with config overrides: ``proxy_factory({"compaction": {...}},
    admin_token="t", upstream_url=...)``. Defaults: the fake upstream, chars4 counting without
    calibration (so thresholds meet the counts a test computes; the calibration tests turn it
    on), a store and source roots in ``tmp_path``, JSON logs into :func:`proxy_log`."""
    runners: list[Any] = []

    def start(overrides: Mapping[str, Any] | None = None, *, admin_token: str | None = None,
              upstream_url: str | None = None) -> RunningProxy:
        index = len(runners)
        state_dir = tmp_path / f"proxy{index}"
        transcripts = state_dir / "transcripts"
        artifacts = state_dir / "artifacts"
        transcripts.mkdir(parents=True)
        artifacts.mkdir(parents=True)
        if admin_token is None:
            monkeypatch.delenv(ADMIN_TOKEN_ENV, raising=False)
        else:
            monkeypatch.setenv(ADMIN_TOKEN_ENV, admin_token)
        mapping = deep_merge({
            "listen": {"host": "127.0.0.1", "port": 0},
            "upstream": {"base_url": upstream_url or upstream_server.base_url,
                         "connect_timeout_s": 5, "read_timeout_s": 30},
            "compaction": {"token_counter": "chars4", "calibration": False},
            "summary": {"max_retries": 0, "timeout_s": 10},
            "store": {"path": str(state_dir / "state.db")},
            "sources": {"transcript_root": str(transcripts), "artifact_root": str(artifacts)},
            "admin": {"token_env": ADMIN_TOKEN_ENV},
            "logging": {"format": "json", "level": "info"},
        }, overrides or {})
        config = Config.from_mapping(mapping)
        configure_logging(config.logging, stream=proxy_log_stream,
                          secrets=[admin_token] if admin_token else [])
        runner, url = servers.run(start_proxy(config))
        runners.append(runner)
        admin_url = runner.app[SERVICES].admin_gate.url  # admin.listen's, when set
        return RunningProxy(url, config, state_dir, transcripts, artifacts, admin_token,
                            extras={"admin_url": admin_url} if admin_url else {},
                            app=runner.app)

    try:
        yield start
    finally:
        for runner in reversed(runners):
            servers.run(runner.cleanup())
        # Leave the process's logging as other tests expect it.
        reset_logging()


@pytest.fixture
def proxy(proxy_factory: ProxyFactory) -> RunningProxy:
    """A proxy with the default test config in front of the fake upstream."""
    return proxy_factory()


@pytest.fixture
def sdk(proxy: RunningProxy) -> Iterator[anthropic.Anthropic]:
    """The real sync SDK pointed at the proxy (retries off)."""
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
async def async_sdk(proxy: RunningProxy) -> Any:
    """The real async SDK pointed at the proxy (retries off)."""
    client = anthropic.AsyncAnthropic(base_url=proxy.base_url, api_key=TEST_API_KEY,
                                      max_retries=0)
    try:
        yield client
    finally:
        await client.close()


def first_text(message: anthropic.types.Message) -> str:
    """The text of a response's first block (which must be a text block)."""
    block = message.content[0]
    assert isinstance(block, anthropic.types.TextBlock)
    return block.text


def error_of(exc: anthropic.APIStatusError) -> dict[str, Any]:
    """The ``error`` object of an SDK exception's Anthropic error body."""
    body = exc.body
    assert isinstance(body, dict) and body.get("type") == "error"
    error: dict[str, Any] = body["error"]
    return error
