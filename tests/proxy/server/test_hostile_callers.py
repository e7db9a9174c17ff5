"""What a caller the proxy has not judged yet can make it keep or wait for (issue #31): the
decoded-body caches are bounded by the memory their objects occupy, keep nothing of a
refused request and nothing another tenant can find; a large body is worked on off the
event loop; a body of absurdly many JSON objects is refused before it is decoded."""

from __future__ import annotations

import asyncio
import gc
import http.client
import json
import threading
import time
import tracemalloc
import uuid
from typing import Any

import msgspec
import pytest

from bench.harness.workloads import history_of_size, request_body
from proxy.fake_upstream import Reply
from proxy.http.compute import OFFLOAD_FROM_BYTES, ComputeThreads
from proxy.http.decoded import DecodedSpans, Staged, object_bytes
from proxy.http.keys import SERVICES
from proxy.http.recent import RecentBodies
from proxy.http.spans import parse_request
from tests.conftest import TEST_API_KEY, ProxyFactory, RunningProxy, UpstreamServer

MODEL = "claude-sonnet-4-5"
#: Views over 2,000 tokens (chars4: ~8 KB) are refused by the proxy.
SMALL_HARD = {"compaction": {"soft_threshold_tokens": 1_000, "hard_limit_tokens": 2_000,
                             "max_tool_result_tokens": 200, "keep_recent_messages": 2,
                             "summary_keep_recent": 2},
              "summary": {"enabled": False}}


def _post(proxy: RunningProxy, body: bytes, *, session: str | None = None,
          key: str = TEST_API_KEY, path: str = "/v1/messages",
          timeout: float = 120.0) -> tuple[int, dict[str, Any]]:
    host, port = proxy.base_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("POST", path, body, {
            "content-type": "application/json", "anthropic-version": "2023-06-01",
            "x-api-key": key,
            "x-compact-session-id": session or f"s-{uuid.uuid4().hex[:12]}"})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        conn.close()


def _tiny_blocks(count: int, salt: str) -> bytes:
    blocks = ",".join(f'{{"type":"text","text":"{salt}{i % 10}"}}' for i in range(count))
    return (f'{{"model":"{MODEL}","max_tokens":16,"messages":'
            f'[{{"role":"user","content":[{blocks}]}}]}}').encode()


def _small_body(text: str) -> bytes:
    return json.dumps({"model": MODEL, "max_tokens": 16,
                       "messages": [{"role": "user", "content": text}]}).encode()


# -- the estimate is never under what the objects occupy ---------------------------------------

SHAPES = {
    "tiny text blocks": "[" + ",".join(f'{{"type":"text","text":"a{i % 10}"}}'
                                       for i in range(3000)) + "]",
    "empty objects": "[" + ",".join(["{}"] * 5000) + "]",
    "empty arrays": "[" + ",".join(["[]"] * 5000) + "]",
    "big integers": "[" + ",".join(str(10**15 + i) for i in range(5000)) + "]",
    "floats": "[" + ",".join(["1e5"] * 5000) + "]",
    "short strings": "[" + ",".join(f'"{i}"' for i in range(5000)) + "]",
    "ascii text": json.dumps({"type": "text", "text": "x" * 200_000}),
    "one emoji in ascii": json.dumps({"type": "text", "text": "😀" + "x" * 200_000},
                                     ensure_ascii=False),
    "an escaped emoji in ascii": json.dumps({"type": "text", "text": "😀" + "x" * 200_000}),
    "cjk": json.dumps({"type": "text", "text": "漢字" * 50_000}, ensure_ascii=False),
    "nested": '{"a":' * 200 + "1" + "}" * 200,
    "a tool loop": json.dumps([{"role": "assistant", "content": [
        {"type": "tool_use", "id": f"toolu_{i}", "name": "Bash", "input": {"command": "ls"}}]}
        for i in range(500)]),
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_the_estimate_is_never_under_what_the_decoded_objects_occupy(name: str) -> None:
    span = SHAPES[name].encode()
    decoder = msgspec.json.Decoder()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        value = decoder.decode(span)
        occupied = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert value is not None
    assert object_bytes(span) >= occupied, (name, object_bytes(span), occupied)


# -- the caches: bounded, per tenant, only for accepted requests --------------------------------

def test_the_caches_stay_within_their_bytes_of_objects() -> None:
    cache, recent = DecodedSpans(max_bytes=400_000), RecentBodies(max_bytes=400_000)
    for index in range(40):
        raw = _tiny_blocks(500, f"b{index}")  # ~15 KB of JSON, ~200 KB of objects
        parsed = parse_request(raw, cache, recent, ("t", f"s{index}"), tenant="t")
        parsed.commit()
        assert cache.held_bytes <= 400_000
        assert recent.held_bytes <= 400_000
    assert len(cache) > 0 and recent.held_bytes > 0


def test_another_tenants_body_is_never_found_in_the_cache() -> None:
    cache = DecodedSpans()
    span = msgspec.Raw(b'{"role":"user","content":"the same bytes"}')
    first = Staged("tenant-a")
    mine = cache.decode(span, first)
    cache.commit(first)
    assert cache.decode(span, Staged("tenant-a")) is mine
    theirs = cache.decode(span, Staged("tenant-b"))
    assert theirs is not mine and theirs.value == mine.value


def test_a_request_that_is_not_committed_leaves_nothing() -> None:
    cache, recent = DecodedSpans(), RecentBodies()
    parse_request(_tiny_blocks(300, "x"), cache, recent, ("t", "s"), tenant="t")
    assert (len(cache), cache.held_bytes, recent.held_bytes) == (0, 0, 0)


def test_refused_requests_leave_nothing_in_the_proxys_caches(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer) -> None:
    proxy = proxy_factory(SMALL_HARD)
    assert proxy.app is not None
    spans, recent = proxy.app[SERVICES].decoded_spans, proxy.app[SERVICES].recent_bodies
    # Refused by the proxy: each view is over the hard limit, a new session and key each.
    for index in range(6):
        status, answer = _post(proxy, _tiny_blocks(3_000, f"h{index}"),
                               key=f"sk-made-up-{index}")
        assert status == 400, answer
        assert answer["error"]["message"].startswith("prompt is too long")
    # Refused by the provider.
    upstream_server.upstream.push(Reply.api_error(401, "authentication_error",
                                                  "invalid x-api-key"))
    status, _ = _post(proxy, _small_body("refused upstream " * 20), key="sk-made-up")
    assert status == 401
    assert (len(spans), spans.held_bytes, recent.held_bytes) == (0, 0, 0)
    # Accepted: now its body is kept, for the session's next request.
    status, _ = _post(proxy, _small_body("accepted " * 20))
    assert status == 200
    assert len(spans) > 0 and spans.held_bytes > 0 and recent.held_bytes > 0


def test_refused_large_bodies_leave_no_token_counts_or_protocol_walks(
        proxy_factory: ProxyFactory) -> None:
    # The small entries a refused body would leave in the shared counts and walks are what
    # pinned its memory in the allocator's arenas after it was freed.
    proxy = proxy_factory({**SMALL_HARD, "compaction": {**SMALL_HARD["compaction"],
                                                        "hard_limit_tokens": 30_000}})
    assert proxy.app is not None
    counter, memo = proxy.app[SERVICES].counter, proxy.app[SERVICES].protocol_memo
    before = (len(counter), len(memo))
    for index in range(3):  # large (worked on by the compute threads), each refused
        body = _tiny_blocks(12_000, f"L{index}")
        assert len(body) >= OFFLOAD_FROM_BYTES
        status, answer = _post(proxy, body, key=f"sk-made-up-{index}")
        assert status == 400, answer
    assert (len(counter), len(memo)) == before
    # A large body that is accepted keeps its counts and walks for its session's next turn.
    body = request_body(history_of_size(600_000, seed=3), stream=False)
    assert len(body) >= OFFLOAD_FROM_BYTES
    status, answer = _post(proxy, body)
    assert status == 200, answer
    assert len(counter) > before[0] and len(memo) > before[1]


def test_a_body_of_absurdly_many_objects_is_refused_before_it_is_decoded(
        proxy_factory: ProxyFactory) -> None:
    proxy = proxy_factory({"limits": {"max_json_objects": 1_000}})
    assert proxy.app is not None
    status, answer = _post(proxy, _tiny_blocks(2_000, "o"))
    assert status == 413
    assert answer["error"]["type"] == "request_too_large"
    assert "2002 JSON objects" in answer["error"]["message"]
    assert "limits.max_json_objects" in answer["error"]["message"]
    assert len(proxy.app[SERVICES].decoded_spans) == 0
    assert _post(proxy, _small_body("well within"))[0] == 200


# -- the loop serves others while a large body is compacted -------------------------------------

def test_the_loop_answers_while_a_large_cold_body_is_compacted(
        proxy_factory: ProxyFactory) -> None:
    proxy = proxy_factory({"compaction": {"token_counter": "tiktoken",
                                          "soft_threshold_tokens": 40_000,
                                          "hard_limit_tokens": 150_000,
                                          "max_tool_result_tokens": 2_000,
                                          "keep_recent_messages": 8,
                                          "summary_keep_recent": 4},
                           "summary": {"enabled": False}})
    body = request_body(history_of_size(20_000_000, seed=7), stream=False)
    host, port = proxy.base_url.removeprefix("http://").split(":")
    done = threading.Event()
    took: list[float] = []

    def big() -> None:
        started = time.perf_counter()
        try:
            status, answer = _post(proxy, body)
            assert status == 200, answer
        finally:
            took.append(time.perf_counter() - started)
            done.set()

    sender = threading.Thread(target=big)
    sender.start()
    waits: list[float] = []
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        time.sleep(0.2)  # the body is on its way (20 MB on loopback: well under this)
        while not done.is_set():
            started = time.perf_counter()
            conn.request("GET", "/healthz")
            conn.getresponse().read()
            waits.append(time.perf_counter() - started)
            time.sleep(0.02)
    finally:
        conn.close()
        sender.join()
    assert took and took[0] > 0.5, took  # the body did take the proxy a while
    assert len(waits) >= 5, (waits, took)
    # On the loop, one /healthz waited for most of the compaction; off it, none waits long.
    assert max(waits) < 0.25 * took[0], (max(waits), took[0])


def test_the_compute_threads_pause_the_collector_only_while_they_work() -> None:
    threads = ComputeThreads(threads=2)
    inside = threading.Barrier(3, timeout=10)
    try:
        assert gc.isenabled()
        # Two works at once: the collector stays off until the last one ends.
        first = threads.submit(lambda: (inside.wait(), gc.isenabled())[1])
        second = threads.submit(lambda: (inside.wait(), gc.isenabled())[1])
        inside.wait()
        assert first.result(10) is False and second.result(10) is False
        assert threads.submit(gc.isenabled).result(10) is False
        assert gc.isenabled()
        # A work that fails still gives the collector back.
        failing = threads.submit(lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            failing.result(10)
        assert gc.isenabled()
    finally:
        threads.shutdown()


async def test_large_bodies_take_turns_and_give_theirs_up_while_waiting_for_a_summary() -> None:
    threads = ComputeThreads()
    try:
        first, second = threads.turn(), threads.turn()
        async with first:
            waiting = asyncio.ensure_future(second.__aenter__())
            await asyncio.sleep(0.01)
            assert not waiting.done()  # one large body at a time
            async with first.paused():  # its summary call: the other has its turn meanwhile
                await asyncio.wait_for(waiting, 1)
                await second.__aexit__(None, None, None)
        # A request cancelled while it waits to resume its turn holds nothing afterwards.
        async with first:
            pause = first.paused()
            await pause.__aenter__()
            async with second:
                resume = asyncio.ensure_future(pause.__aexit__(None, None, None))
                await asyncio.sleep(0.01)
                assert not resume.done()
                resume.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await resume
        # Every turn was given back, and none twice.
        async with threads.turn():
            assert threads._turns is not None and threads._turns.locked()
        assert not threads._turns.locked()
    finally:
        threads.shutdown()
