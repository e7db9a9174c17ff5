"""End to end: the audit log as the real proxy writes it, with the real SDK against the fake
provider on loopback. Every ``/v1/messages`` and ``count_tokens`` request leaves one entry
(forwarded, compacted, refused for size, refused for its tool protocol, streamed), read back
through the admin API; the write never holds the response up; the bounds of ``audit.*``
hold; ``audit.enabled: false`` writes nothing."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import aiohttp
import anthropic
import pytest

from proxy.audit.log import RequestEntry
from proxy.config import Config
from proxy.server.app import start_proxy
from proxy.store import SQLiteStateStore, StoreError
from proxy.telemetry.logs import configure_logging, reset_logging
from tests.conftest import (
    TEST_API_KEY,
    LoopThread,
    ProxyFactory,
    RunningProxy,
    UpstreamServer,
    user_text,
)
from tests.proxy.e2e.helpers import LOW_THRESHOLDS, read_turns

MODEL = "claude-sonnet-4-5"
TOKEN = "admin-audit-e2e-token-3f9a1c5e7b2d4f6a"
SESSION = "audit-e2e"


def admin_get(proxy: RunningProxy, path: str) -> Any:
    """GET an admin path of the running proxy with its token; the JSON of a 200."""

    async def get() -> Any:
        async with aiohttp.ClientSession() as http:
            async with http.get(proxy.base_url + path, headers={
                    "Authorization": f"Bearer {proxy.admin_token}"}) as resp:
                assert resp.status == 200, await resp.text()
                return await resp.json()

    return asyncio.run(get())


def wait_for_requests(proxy: RunningProxy, session: str, count: int, *,
                      newest: str | None = None, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The session's entries, newest first, once it has ``count`` of them (and the newest is
    request ``newest``, when given): they are written just after each response."""
    deadline = time.monotonic() + timeout
    while True:
        body = admin_get(proxy, f"/admin/sessions/{session}/requests")
        arrived = newest is None or (body["requests"] and
                                     body["requests"][0]["request_id"] == newest)
        if (body["total"] >= count and arrived) or time.monotonic() > deadline:
            assert body["total"] == count, body
            entries: list[dict[str, Any]] = body["requests"]
            return entries
        time.sleep(0.05)


def headers(session: str = SESSION) -> dict[str, str]:
    return {"x-compact-session-id": session}


def test_every_messages_and_count_tokens_request_leaves_one_entry(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    """Forwarded, compacted (each layer with what it saved), counted, streamed, refused over
    the hard limit (with the limit and the layers that ran) and refused for its tool protocol:
    one entry each, with the model, statuses and the provider's usage when it answered; a
    pass-through call leaves none."""
    proxy = proxy_factory({"compaction": {**LOW_THRESHOLDS, "hard_limit_tokens": 20_000},
                           "summary": {"enabled": False}}, admin_token=TOKEN)
    small: list[Any] = [{"role": "user", "content": user_text("hello")}]
    history = read_turns(12)
    bad_protocol = [*small, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_x", "name": "Read", "input": {"file_path": "/a"}}]},
        {"role": "user", "content": user_text("no result")}]
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    with client:
        plain = client.messages.with_raw_response.create(
            model=MODEL, max_tokens=16, messages=small, extra_headers=headers())
        compacted = client.messages.with_raw_response.create(
            model=MODEL, max_tokens=16, messages=history, extra_headers=headers())
        client.messages.count_tokens(model=MODEL, messages=history, extra_headers=headers())
        with client.messages.stream(model=MODEL, max_tokens=16, messages=small,
                                    extra_headers=headers()) as stream:
            stream.get_final_message()
        with pytest.raises(anthropic.BadRequestError):
            client.messages.create(model=MODEL, max_tokens=16, extra_headers=headers(),
                                   messages=[{"role": "user", "content": user_text("q" * 90_000)}])
        with pytest.raises(anthropic.BadRequestError):
            client.messages.create(model=MODEL, max_tokens=16, messages=bad_protocol,
                                   extra_headers=headers())
        client.models.list()
    entries = wait_for_requests(proxy, SESSION, 6)
    toolerr, limit, streamed, counted, compact, forwarded = entries

    assert forwarded["request_id"] == plain.headers["x-compact-request-id"]
    assert (forwarded["route"], forwarded["outcome"], forwarded["status"],
            forwarded["upstream_status"], forwarded["model"], forwarded["role"]) == (
        "messages", "forwarded", 200, 200, MODEL, "main")
    assert forwarded["layers"] == [] and forwarded["blocked"] is False
    assert forwarded["tokens_before"] == forwarded["tokens_after"] > 0
    assert forwarded["usage_input"] > 0 and forwarded["usage_output"] > 0
    assert forwarded["tenant"] == "none" and forwarded["duration_ms"] > 0

    assert compact["request_id"] == compacted.headers["x-compact-request-id"]
    applied = compacted.headers["x-compact-layers"].split(",")
    assert [layer["layer"] for layer in compact["layers"] if layer["saved"]] == applied
    assert all(layer["saved"] > 0 for layer in compact["layers"] if layer["layer"] in applied)
    assert compact["tokens_before"] == int(compacted.headers["x-compact-tokens-before"])
    assert compact["tokens_after"] == int(compacted.headers["x-compact-tokens-after"])
    assert sum(layer["saved"] for layer in compact["layers"]) == (
        compact["tokens_before"] - compact["tokens_after"])
    assert compact["usage_input"] is not None

    assert (counted["route"], counted["outcome"], counted["status"]) == (
        "count_tokens", "forwarded", 200)
    assert counted["tokens_after"] == compact["tokens_after"]
    assert streamed["usage_output"] is not None and streamed["status"] == 200

    assert (limit["outcome"], limit["reason"], limit["hard_limit"], limit["status"],
            limit["upstream_status"], limit["blocked"]) == (
        "blocked", "MessageViewLimitExceeded", 20_000, 400, None, True)
    assert limit["tokens_after"] >= 20_000 and limit["layers"]
    assert limit["usage_input"] is None

    # A broken tool protocol is the client's mistake (invalid), not a limit (blocked).
    assert (toolerr["outcome"], toolerr["reason"], toolerr["hard_limit"], toolerr["status"],
            toolerr["blocked"]) == ("invalid", "ToolProtocolError", None, 400, False)
    assert toolerr["model"] == MODEL

    (summary,) = admin_get(proxy, "/admin/sessions")["sessions"]
    assert (summary["session_id"], summary["requests"], summary["blocked"]) == (SESSION, 6, 1)


def test_entries_are_trimmed_to_the_configured_bound(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    """audit.max_requests_per_session 2: after three requests the session holds the two
    newest."""
    proxy = proxy_factory({"audit": {"max_requests_per_session": 2}}, admin_token=TOKEN)
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    ids = []
    with client:
        for index in range(3):
            raw = client.messages.with_raw_response.create(
                model=MODEL, max_tokens=16, extra_headers=headers("bounded"),
                messages=[{"role": "user", "content": user_text(f"turn {index}")}])
            ids.append(raw.headers["x-compact-request-id"])
            wait_for_requests(proxy, "bounded", min(index + 1, 2), newest=ids[-1])
    entries = wait_for_requests(proxy, "bounded", 2, newest=ids[-1])
    assert [entry["request_id"] for entry in entries] == ids[:0:-1]


def test_nothing_is_recorded_when_the_audit_log_is_off(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    """audit.enabled false: requests are served and leave no entry; admin writes leave no
    change."""
    proxy = proxy_factory({"audit": {"enabled": False}}, admin_token=TOKEN)
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    with client:
        client.messages.create(model=MODEL, max_tokens=16, extra_headers=headers("off"),
                               messages=[{"role": "user", "content": user_text("hi")}])

    async def put_state() -> int:
        async with aiohttp.ClientSession() as http:
            async with http.put(f"{proxy.base_url}/admin/sessions/off/state", json={},
                                headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
                return resp.status

    assert asyncio.run(put_state()) == 201
    time.sleep(0.3)  # well past the moment a write would have happened

    async def read() -> tuple[Any, ...]:
        store = await SQLiteStateStore(proxy.config.store.path).open()
        try:
            return (await store.sessions(), await store.state_changes("none", "off"))
        finally:
            await store.close()

    assert asyncio.run(read()) == (([], 0), [])


class HeldStore(SQLiteStateStore):
    """A SQLite store whose audit writes wait until the test lets them go."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.release = threading.Event()
        self.waiting = threading.Event()

    async def add_request(self, entry: RequestEntry) -> None:
        self.waiting.set()
        await asyncio.to_thread(self.release.wait, 10)
        await super().add_request(entry)


def test_the_response_never_waits_for_its_audit_entry(
    servers: LoopThread, upstream_server: UpstreamServer, tmp_path: Path
) -> None:
    """With the audit write held, the response is complete; the entry lands once released."""
    store = HeldStore(tmp_path / "state.db")
    config = Config.from_mapping({
        "listen": {"host": "127.0.0.1", "port": 0},
        "upstream": {"base_url": upstream_server.base_url},
        "compaction": {"token_counter": "chars4", "calibration": False},
        "sources": {"transcript_root": str(tmp_path), "artifact_root": str(tmp_path)},
    })
    servers.run(store.open())
    runner, url = servers.run(start_proxy(config, store=store))
    try:
        client = anthropic.Anthropic(base_url=url, api_key=TEST_API_KEY, max_retries=0)
        with client:
            started = time.monotonic()
            message = client.messages.create(
                model=MODEL, max_tokens=16, extra_headers=headers("held"),
                messages=[{"role": "user", "content": user_text("hi")}])
            assert message.content and time.monotonic() - started < 5
        assert store.waiting.wait(5)
        assert servers.run(store.session_requests("none", "held")) == ([], 0)
        store.release.set()
        deadline = time.monotonic() + 5
        while servers.run(store.session_requests("none", "held"))[1] == 0:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        (entry,), _ = servers.run(store.session_requests("none", "held"))
        assert entry.at <= datetime.now(UTC) and entry.outcome == "forwarded"
    finally:
        store.release.set()
        servers.run(runner.cleanup())
        servers.run(store.close())


class FailingStore(SQLiteStateStore):
    """A SQLite store whose audit writes fail (a coroutine that raises)."""

    async def add_request(self, entry: RequestEntry) -> None:  # type: ignore[override]
        raise StoreError("the audit table is locked")


class RefusingStore(SQLiteStateStore):
    """A SQLite store that refuses an audit entry at once, before any write."""

    def add_request(self, entry: RequestEntry) -> asyncio.Future[None]:
        raise StoreError("the audit log is closed")


class FailingBatchStore(SQLiteStateStore):
    """A SQLite store whose batched audit write fails in its worker thread: the future it
    handed back fails later."""

    def _add_requests(self, batch: list[RequestEntry]) -> None:
        raise StoreError("disk I/O error")


@pytest.mark.parametrize("store_class", [FailingStore, RefusingStore, FailingBatchStore])
def test_a_failed_audit_write_never_fails_the_request(
    servers: LoopThread, upstream_server: UpstreamServer, tmp_path: Path,
    proxy_log_stream: TextIO, proxy_log: Path, store_class: type[SQLiteStateStore],
) -> None:
    """The answer comes back as usual, however the write fails (a coroutine that raises, a
    refusal at once, a batch that fails later); the failure is one audit_not_recorded warning
    naming the error's class, on the request's own log context."""
    from tests.conftest import read_log

    store = store_class(tmp_path / "state.db")
    config = Config.from_mapping({
        "listen": {"host": "127.0.0.1", "port": 0},
        "upstream": {"base_url": upstream_server.base_url},
        "compaction": {"token_counter": "chars4", "calibration": False},
        "sources": {"transcript_root": str(tmp_path), "artifact_root": str(tmp_path)},
    })
    servers.run(store.open())
    configure_logging(config.logging, stream=proxy_log_stream)
    runner, url = servers.run(start_proxy(config, store=store))
    try:
        with anthropic.Anthropic(base_url=url, api_key=TEST_API_KEY, max_retries=0) as client:
            raw = client.messages.with_raw_response.create(
                model=MODEL, max_tokens=16, extra_headers=headers("failing"),
                messages=[{"role": "user", "content": user_text("hi")}])
        assert raw.http_response.status_code == 200
        request_id = raw.headers["x-compact-request-id"]
        deadline = time.monotonic() + 5
        while not any(line["event"] == "audit_not_recorded" for line in read_log(proxy_log)
                      if line.get("request_id") == request_id):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        (line,) = [line for line in read_log(proxy_log) if line.get("request_id") == request_id
                   and line["event"] == "audit_not_recorded"]
        assert line["error_class"] == "StoreError" and line["level"] == "warning"
    finally:
        servers.run(runner.cleanup())
        servers.run(store.close())
        reset_logging()
