"""End to end: three ``compact-proxy serve`` processes on one Redis (standalone, and a Redis
Cluster) give the same answers as one.

The provider is the strict fake upstream (in this process, recording what it received); the
proxies are real subprocesses with calibration on, each with a ``PYTHONHASHSEED`` of its own
(message fingerprints do not depend on it); the client is the anthropic SDK or aiohttp.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import pytest
import yaml

from proxy.fake_upstream import (
    FakeUpstream,
    Fault,
    RecordedRequest,
    default_script,
    is_summarizer_request,
)
from proxy.fake_upstream.replies import TokenRule
from proxy.fake_upstream.server import start_fake_upstream
from tests.conftest import TEST_API_KEY, LoopThread, UpstreamServer, deep_merge, user_text
from tests.reliability.conftest import (
    PYTHON,
    RELIABILITY_ADMIN_TOKEN,
    ServiceProcess,
    _proxy_url,
    _spawn,
)

pytestmark = pytest.mark.slow

MODEL = "claude-sonnet-4-5"
AUTH = {"Authorization": f"Bearer {RELIABILITY_ADMIN_TOKEN}"}
POLICY = {"soft_threshold_tokens": 3000, "hard_limit_tokens": 60000,
          "max_tool_result_tokens": 2000, "keep_recent_messages": 40, "summary_keep_recent": 4}
MODES = ["standalone", "cluster"]
#: A soft threshold crossed again a turn or two after each compaction.
TIGHT = {**POLICY, "soft_threshold_tokens": 1200}

Start = Callable[..., ServiceProcess]


@pytest.fixture(params=MODES)
def redis_store(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The ``store`` section of every replica: one Redis server, or a three-master cluster."""
    if request.param == "standalone":
        return {"backend": "redis", "url": request.getfixturevalue("redis_url")}
    return {"backend": "redis", "url": request.getfixturevalue("redis_cluster_url"),
            "redis_mode": "cluster"}


@pytest.fixture
def start_proxy(tmp_path: Path) -> Iterator[Start]:
    """``start(upstream_url, store_section)``: a ``compact-proxy serve`` subprocess, each with
    another ``PYTHONHASHSEED`` (as on other hosts, or after a restart)."""
    started: list[ServiceProcess] = []

    def start(upstream_url: str, store: dict[str, Any],
              policy: dict[str, Any] = POLICY) -> ServiceProcess:
        state_dir = tmp_path / f"replica{len(started)}"
        for name in ("transcripts", "artifacts"):
            (state_dir / name).mkdir(parents=True, exist_ok=True)
        mapping = deep_merge({
            "listen": {"host": "127.0.0.1", "port": 0},
            "upstream": {"base_url": upstream_url, "connect_timeout_s": 5, "read_timeout_s": 30},
            "compaction": {"token_counter": "chars4", "calibration": True, **policy},
            "summary": {"max_retries": 0, "timeout_s": 20},
            "store": {"path": str(state_dir / "state.db")},
            "sources": {"transcript_root": str(state_dir / "transcripts"),
                        "artifact_root": str(state_dir / "artifacts")},
            "admin": {"token_env": "COMPACT_PROXY_REPLICA_ADMIN_TOKEN"},
            "logging": {"format": "json", "level": "info"},
        }, {"store": store})
        config_path = state_dir / "config.yaml"
        config_path.write_text(yaml.safe_dump(mapping), encoding="utf-8")
        service = _spawn([PYTHON, "-m", "proxy.cli", "serve", "--config", str(config_path)],
                         env={"COMPACT_PROXY_REPLICA_ADMIN_TOKEN": RELIABILITY_ADMIN_TOKEN,
                              "PYTHONHASHSEED": str(20261203 + len(started))},
                         find_url=_proxy_url, tap_stream="stderr")
        started.append(service)
        return service

    try:
        yield start
    finally:
        for service in reversed(started):
            service.stop()


@pytest.fixture
def paced_upstream(servers: LoopThread) -> Iterator[UpstreamServer]:
    """A recording fake upstream whose summary answers take 1 s and whose streams send an
    event every 50 ms (so crossings overlap, and a stream can be cut in the middle)."""

    def script(body: dict[str, Any], meta: RecordedRequest) -> Any:
        reply = default_script(body, meta)
        if is_summarizer_request(body):
            return dataclasses.replace(reply, fault=Fault("slow_first_byte", hang_s=1.0))
        return dataclasses.replace(reply, event_delay_s=0.05)

    upstream = FakeUpstream(script)
    runner, url = servers.run(start_fake_upstream(upstream))
    try:
        yield UpstreamServer(upstream, url, int(url.rsplit(":", 1)[1]))
    finally:
        servers.run(runner.cleanup())


def turn_messages(tag: str, turns: int) -> list[dict[str, Any]]:
    """A session's history after ``turns`` tool calls (each result ~150 tokens), ending in a
    user turn. ``tag`` makes its spans (and so its summaries) this test's own."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": user_text(f"task {tag}")}]
    for index in range(turns):
        tool_id = f"toolu_{index:04d}"
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": f"Step {index}: reading."},
            {"type": "tool_use", "id": tool_id, "name": "Read",
             "input": {"file_path": f"/src/{tag}/mod{index}.py"}}]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tool_id,
             "content": f"# {tag} module {index}\n" + f"value_{index} = {index}\n" * 40}]})
    return messages


def client_bodies(upstream: FakeUpstream, session: str) -> list[str]:
    """The forwarded bodies of one session's own requests (not summary calls), as JSON (told
    by the test's own ``x-test-session``: the proxy keeps its session header to itself)."""
    return [json.dumps(r.body) for r in upstream.message_requests
            if r.headers.get("x-test-session") == session
            and not is_summarizer_request(r.body)]


def summary_count(upstream: FakeUpstream, tag: str) -> int:
    return sum(1 for r in upstream.message_requests
               if is_summarizer_request(r.body) and tag in json.dumps(r.body))


def settled_summary_count(upstream: FakeUpstream, tag: str, quiet_s: float = 1.0) -> int:
    """:func:`summary_count` once no summary call has come for ``quiet_s``: the next
    crossing's summary is made in the background (``summary.prepare_at``), so the last
    turn's may still be on its way when the session's last answer is in."""
    deadline = time.monotonic() + 30
    count = summary_count(upstream, tag)
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        again = summary_count(upstream, tag)
        if again == count:
            break
        count = again
    return count


#: What the proxy says of each answer's compaction (the same from every replica).
SAID = ("x-compact-layers", "x-compact-tokens-before", "x-compact-tokens-after")


def run_session(urls: list[str], session: str, tag: str, turns: int,
                first: int = 1) -> list[dict[str, str]]:
    """Send the session's turns ``first`` to ``turns`` round-robin over ``urls``; what each
    answer's headers said of its compaction (:data:`SAID`)."""
    said: list[dict[str, str]] = []
    clients = [anthropic.Anthropic(base_url=url, api_key=TEST_API_KEY, max_retries=0)
               for url in urls]
    try:
        for turn in range(first, turns + 1):
            client = clients[turn % len(clients)]
            raw = client.messages.with_raw_response.create(
                model=MODEL, max_tokens=256, messages=turn_messages(tag, turn),
                extra_headers={"x-compact-session-id": session, "x-test-session": session})
            said.append({name: raw.headers[name] for name in SAID})
    finally:
        for client in clients:
            client.close()
    return said


def test_a_session_round_robin_over_three_replicas_gets_a_single_replicas_views(
        start_proxy: Start, upstream_server: UpstreamServer, redis_store: dict[str, Any],
        tmp_path: Path) -> None:
    """50 turns, each on the next of three replicas (one Redis): every forwarded body is
    the one a single replica (on its own SQLite file) forwards for the same turn, crossing
    the soft threshold with L4 summaries on the way."""
    tag = uuid.uuid4().hex[:12]
    turns = 50
    # The provider counts its own way (1.3 x chars / 4, +-10 % per block): calibration moves
    # the thresholds, so replicas that did not share it would cross on other turns.
    upstream_server.upstream.token_rule = TokenRule(1.3, 0.1)
    single = start_proxy(upstream_server.base_url, {"path": str(tmp_path / "single.db")})
    alone_layers = run_session([single.base_url], f"alone-{tag}", tag, turns)
    alone_summaries = settled_summary_count(upstream_server.upstream, tag)
    single.stop()
    alone = client_bodies(upstream_server.upstream, f"alone-{tag}")

    replicas = [start_proxy(upstream_server.base_url, redis_store) for _ in range(3)]
    fleet_layers = run_session([r.base_url for r in replicas], f"fleet-{tag}", tag, turns)
    fleet = client_bodies(upstream_server.upstream, f"fleet-{tag}")

    assert len(alone) == len(fleet) == turns
    assert sum("L4" in said["x-compact-layers"].split(",") for said in alone_layers) >= 2
    # The session id header differs; everything else is the same, turn by turn.
    for number, (one, many) in enumerate(zip(alone, fleet, strict=True), start=1):
        assert one == many, f"turn {number}: the fleet forwarded another view"
    assert fleet_layers == alone_layers
    # The fleet found the single replica's summaries in no cache of its own: it made the same
    # number of summary calls (one per crossing), never more.
    assert settled_summary_count(upstream_server.upstream, tag) == 2 * alone_summaries


def test_two_replicas_with_other_hash_seeds_and_a_restart_forward_one_replicas_views(
        start_proxy: Start, upstream_server: UpstreamServer, redis_url: str,
        tmp_path: Path) -> None:
    """Two replicas on one Redis, each with another ``PYTHONHASHSEED``, serve a session in
    turn, and one is restarted (another seed again) halfway: every forwarded body is the one
    a single replica forwards for that turn. Message fingerprints key the calibration's
    per-message counts and the checkpoints in the store, so they must not depend on the
    interpreter's string hashes."""
    tag = uuid.uuid4().hex[:12]
    turns = 40
    # Blocks the provider counts far from the estimate (+-90 %): each message's own count,
    # learnt from the answers and kept by its fingerprint, is what sets the totals.
    upstream_server.upstream.token_rule = TokenRule(1.3, 0.9)
    single = start_proxy(upstream_server.base_url, {"path": str(tmp_path / "single.db")}, TIGHT)
    alone_layers = run_session([single.base_url], f"alone-{tag}", tag, turns)
    single.stop()
    alone = client_bodies(upstream_server.upstream, f"alone-{tag}")

    store = {"backend": "redis", "url": redis_url}
    a, b = (start_proxy(upstream_server.base_url, store, TIGHT) for _ in range(2))
    half = turns // 2
    fleet_layers = run_session([a.base_url, b.base_url], f"fleet-{tag}", tag, half)
    b.stop()
    restarted = start_proxy(upstream_server.base_url, store, TIGHT)
    fleet_layers += run_session([a.base_url, restarted.base_url], f"fleet-{tag}", tag, turns,
                                first=half + 1)
    fleet = client_bodies(upstream_server.upstream, f"fleet-{tag}")

    assert len(alone) == len(fleet) == turns
    assert sum("L4" in said["x-compact-layers"].split(",") for said in alone_layers) >= 1
    for number, (one, many) in enumerate(zip(alone, fleet, strict=True), start=1):
        assert one == many, f"turn {number}: the replicas forwarded another view"
    assert fleet_layers == alone_layers


async def _put_fact(http: aiohttp.ClientSession, url: str, session: str, text: str,
                    version: int | None) -> int:
    headers = dict(AUTH)
    if version is not None:
        headers["If-Match"] = f'"{version}"'
    async with http.put(f"{url}/admin/sessions/{session}/state", headers=headers, json={
            "facts": [{"fact_id": "f1", "content": text,
                       "source_pointer": f"transcript:{session}:1",
                       "last_confirmed_at": "2026-12-01T12:00:00Z"}],
            "pending_items": [], "retrieval_evidence": []}) as resp:
        assert resp.status in (200, 201), await resp.text()
        body = await resp.json()
    return int(body["version"])


async def _ask(http: aiohttp.ClientSession, url: str, session: str) -> None:
    async with http.post(f"{url}/v1/messages", headers={
            "x-api-key": TEST_API_KEY, "anthropic-version": "2023-06-01",
            "x-compact-session-id": session, "x-test-session": session}, json={
            "model": MODEL, "max_tokens": 64,
            "messages": [{"role": "user", "content": user_text("hello")}]}) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()


def test_an_admin_write_on_one_replica_is_in_the_very_next_request_on_the_others(
        start_proxy: Start, upstream_server: UpstreamServer,
        redis_store: dict[str, Any]) -> None:
    """PUT on A, then at once a request on B and one on C: both forward the new fact; so do
    they after an update on B and a delete on C (no time window anywhere)."""
    a, b, c = (start_proxy(upstream_server.base_url, redis_store) for _ in range(3))
    session = f"admin-{uuid.uuid4().hex[:12]}"

    def last_system() -> str:
        return json.dumps(json.loads(
            client_bodies(upstream_server.upstream, session)[-1]).get("system"))

    async def scenario() -> None:
        async with aiohttp.ClientSession() as http:
            for replica in (b, c):  # each caches "no state"
                await _ask(http, replica.base_url, session)
                assert "first fact" not in last_system()
            version = await _put_fact(http, a.base_url, session, "first fact", None)
            for replica in (b, c):
                await _ask(http, replica.base_url, session)
                assert "first fact" in last_system()
            await _put_fact(http, b.base_url, session, "second fact", version)
            for replica in (c, a):
                await _ask(http, replica.base_url, session)
                assert "second fact" in last_system() and "first fact" not in last_system()
            async with http.delete(f"{c.base_url}/admin/sessions/{session}/state",
                                   headers=AUTH) as resp:
                assert resp.status in (200, 204)
            for replica in (a, b):
                await _ask(http, replica.base_url, session)
                assert "second fact" not in last_system()

    asyncio.run(scenario())


def test_ten_concurrent_crossings_over_three_replicas_make_one_summary_call(
        start_proxy: Start, paced_upstream: UpstreamServer,
        redis_store: dict[str, Any]) -> None:
    """Ten requests crossing the threshold with the same history at once, spread over three
    replicas (in-process single flight in front of the store's lease): one summary call,
    and all ten forward the same view."""
    replicas = [start_proxy(paced_upstream.base_url, redis_store) for _ in range(3)]
    tag = uuid.uuid4().hex[:12]
    session = f"burst-{tag}"
    history = turn_messages(tag, 30)

    async def one(index: int) -> str:
        client = anthropic.AsyncAnthropic(base_url=replicas[index % 3].base_url,
                                          api_key=TEST_API_KEY, max_retries=0)
        async with client:
            raw = await client.messages.with_raw_response.create(
                model=MODEL, max_tokens=64, messages=history,
                extra_headers={"x-compact-session-id": session, "x-test-session": session})
            return raw.headers["x-compact-layers"]

    async def burst() -> list[str]:
        return await asyncio.gather(*(one(index) for index in range(10)))

    layers = asyncio.run(burst())
    assert all("L4" in found.split(",") for found in layers), layers
    assert summary_count(paced_upstream.upstream, tag) == 1
    assert len(set(client_bodies(paced_upstream.upstream, session))) == 1


def test_a_replica_killed_mid_stream_then_the_retry_on_another_gets_the_same_view(
        start_proxy: Start, paced_upstream: UpstreamServer,
        redis_store: dict[str, Any]) -> None:
    """A crossing request streams from A; A is SIGKILLed mid-stream; the client retries the
    same request on B, which forwards byte for byte the view A did (A's checkpoint and
    summary, found in the store)."""
    a, b = (start_proxy(paced_upstream.base_url, redis_store) for _ in range(2))
    tag = uuid.uuid4().hex[:12]
    session = f"kill-{tag}"
    body = {"model": MODEL, "max_tokens": 64, "stream": True,
            "messages": turn_messages(tag, 30)}
    headers = {"x-api-key": TEST_API_KEY, "anthropic-version": "2023-06-01",
               "x-compact-session-id": session, "x-test-session": session}

    async def scenario() -> bytes:
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.ClientError):
                async with http.post(f"{a.base_url}/v1/messages", json=body,
                                     headers=headers) as resp:
                    assert resp.status == 200
                    await resp.content.readline()  # the stream has begun
                    os.kill(a.pid, signal.SIGKILL)
                    await resp.read()
            async with http.post(f"{b.base_url}/v1/messages", json=body,
                                 headers=headers) as resp:
                assert resp.status == 200
                return await resp.read()

    answer = asyncio.run(scenario())
    assert b"message_stop" in answer
    a.process.wait(timeout=10)
    views = client_bodies(paced_upstream.upstream, session)
    assert len(views) == 2 and views[0] == views[1]
    assert summary_count(paced_upstream.upstream, tag) == 1
