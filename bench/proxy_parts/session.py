"""Part 7 of ``bench/proxy.py``: a simulated agent session resent in full every
turn, against the fake provider in this process so every forwarded view can be checked."""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp
from aiohttp import web

from bench.harness.client import send
from bench.harness.config import Thresholds
from bench.harness.processes import proxy_process
from bench.harness.stats import Dist, percentile
from bench.harness.workloads import AgentSession, request_body, request_headers
from bench.proxy_parts.latency import _header_int
from bench.stamped_upstream import CONTEXT_WINDOW
from compactor import CachingCounter
from compactor._fingerprint import strip_cache_control
from proxy.fake_upstream import (
    FakeUpstream,
    RecordedRequest,
    Reply,
    default_script,
    is_summarizer_request,
    start_fake_upstream,
)

PARSE_FLOOR_EVERY: Final = 5  # time json.loads of every 5th session body, as a reference


@dataclass
class _ViewRecord:
    tools: Any
    system: Any
    messages: list[Any]


class SessionUpstream(FakeUpstream):
    """The fake provider in this process, reading every forwarded view as it arrives.

    Per forwarded view (``cache_control`` ignored) it counts the view's tokens and those of
    its common prefix with the previous view — tools, then system, then whole messages —
    with ``CachingCounter(TiktokenCounter())``. Summary calls (``system`` holding the
    summarizer marker) are counted instead. A timing middleware adds up the time spent in
    its handlers and counts response statuses. Recorded requests are dropped as they come.
    """

    def __init__(self, counter: CachingCounter) -> None:
        super().__init__(self._answer, context_window=CONTEXT_WINDOW)
        self.counter = counter
        self.busy_s = 0.0
        self.statuses: Counter[int] = Counter()
        self.summary_calls = 0
        self.views: list[tuple[int, int, int, int]] = []  # total, prefix, prefix msgs, prev len
        self._previous: _ViewRecord | None = None

    def make_app(self) -> web.Application:
        """The fake provider's app with the timing middleware outermost."""
        app = super().make_app()

        @web.middleware
        async def timing(request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                         ) -> web.StreamResponse:
            start = time.perf_counter()
            status = 0
            try:
                response = await handler(request)
                status = response.status
                return response
            finally:
                self.busy_s += time.perf_counter() - start
                self.statuses[status] += 1

        app.middlewares.insert(0, timing)
        return app

    def _answer(self, body: dict[str, Any], meta: RecordedRequest) -> Reply:
        self.requests.clear()
        if is_summarizer_request(body):
            self.summary_calls += 1
        else:
            self._account(body)
        return default_script(body, meta)

    def _account(self, body: dict[str, Any]) -> None:
        counter = self.counter
        view = _ViewRecord(strip_cache_control(body.get("tools")),
                           strip_cache_control(body.get("system")),
                           [strip_cache_control(m) for m in body["messages"]])
        fixed = (counter.count_value(view.tools), counter.count_value(view.system))
        tokens = [counter.count_message(m) for m in view.messages]
        total = sum(fixed) + sum(tokens)
        prefix = prefix_messages = 0
        previous = self._previous
        if previous is not None and previous.tools == view.tools:
            prefix += fixed[0]
            if previous.system == view.system:
                prefix += fixed[1]
                # zip stops at the shorter view: the prefix cannot be longer than either.
                for mine, theirs, count in zip(view.messages, previous.messages, tokens,
                                               strict=False):
                    if mine != theirs:
                        break
                    prefix += count
                    prefix_messages += 1
        self.views.append((total, prefix, prefix_messages,
                           len(previous.messages) if previous is not None else 0))
        self._previous = view


@dataclass(frozen=True)
class TurnRow:
    """One turn of the session as measured.

    ``added_ms`` is the client's latency minus the time the provider spent in its handlers
    during the turn (the forwarded request and any summary call).
    """

    turn: int
    body_bytes: int
    status: int
    added_ms: float
    summary_calls: int
    tokens_before: int | None
    tokens_after: int | None
    layers: str
    crossing: bool
    recompacted: bool
    parse_ms: float | None


@dataclass(frozen=True)
class Bucket:
    """The turns ``first``–``last``: mean body size, added time, the json.loads reference."""

    first: int
    last: int
    body_mb: float
    added: Dist
    parse_p50_ms: float
    warm: bool


@dataclass(frozen=True)
class SessionReport:
    """Part 4 for one compaction mode.

    Attributes:
        sticky: the mode.
        turns: requests sent (one per turn).
        client_failures: answers other than 200 the client got.
        upstream_failures: answers other than 200 the provider gave (a view that broke its
            rules, or a summary call it refused).
        forwarded_views: views the provider received (summary calls excluded).
        forwarded_tokens: their input tokens, summed.
        cacheable_tokens: tokens of their common prefixes with the previous view, summed.
        raw_tokens: what the client sent (``x-compact-tokens-before``), summed.
        summary_calls: summary calls the provider received.
        crossings: turns where the previous forwarded view plus the turn's new messages (their
            tool results capped at ``max_tool_result_tokens``, as L1 does) reached the soft
            threshold: the moments the session's context crossed it.
        recompactions: turns whose forwarded view does not extend the previous one.
        layer_counts: how often each layer appears in ``x-compact-layers``.
        buckets: added time by history size.
        seconds: wall time of the session.
    """

    sticky: bool
    turns: int
    client_failures: int
    upstream_failures: int
    forwarded_views: int
    forwarded_tokens: int
    cacheable_tokens: int
    raw_tokens: int
    summary_calls: int
    crossings: int
    recompactions: int
    layer_counts: dict[str, int]
    buckets: tuple[Bucket, ...]
    seconds: float
    rows: tuple[TurnRow, ...] = field(repr=False, default=())

    @property
    def cacheable_share(self) -> float:
        """Cacheable share of the forwarded input tokens."""
        return self.cacheable_tokens / self.forwarded_tokens if self.forwarded_tokens else math.nan

    @property
    def flatness(self) -> float:
        """Highest over lowest p50 added time of the warm buckets (1.0 = perfectly flat)."""
        warm = [b.added.p50 for b in self.buckets if b.warm and b.added.n]
        if len(warm) < 2 or min(warm) <= 0:
            return math.nan
        return max(warm) / min(warm)


def _capped_tokens(messages: Iterable[dict[str, Any]], counter: CachingCounter, cap: int) -> int:
    """Tokens of ``messages`` with every tool result counted at most ``cap`` (L1's effect)."""
    total = 0
    for message in messages:
        total += counter.count_message(message)
        for block in message.get("content") or ():
            if isinstance(block, dict) and block.get("type") == "tool_result":
                total -= max(0, counter.count_value(block.get("content")) - cap)
    return total


def _buckets(rows: Sequence[TurnRow], width: int, first_crossing: int | None) -> tuple[Bucket, ...]:
    out = []
    for start in range(0, len(rows), width):
        chunk = rows[start:start + width]
        parses = [r.parse_ms for r in chunk if r.parse_ms is not None]
        out.append(Bucket(chunk[0].turn, chunk[-1].turn,
                          sum(r.body_bytes for r in chunk) / len(chunk) / 1e6,
                          Dist.of([r.added_ms for r in chunk if r.status == 200]),
                          percentile(parses, 50),
                          first_crossing is not None and chunk[0].turn > first_crossing))
    return tuple(out)


async def run_session(client: aiohttp.ClientSession, workdir: Path, thresholds: Thresholds,
                      turns: int, *, sticky: bool, counter: CachingCounter) -> SessionReport:
    """Part 4 for one mode: a fresh in-process provider, a fresh proxy process."""
    upstream = SessionUpstream(counter)
    runner, upstream_url = await start_fake_upstream(upstream, "127.0.0.1", 0)
    mode = "sticky" if sticky else "recompute"
    try:
        async with proxy_process(client, workdir, f"proxy-session-{mode}", upstream_url,
                                 thresholds, sticky=sticky) as proxy:
            return await _drive_session(client, proxy.url, upstream, thresholds, turns,
                                        sticky=sticky, counter=counter)
    finally:
        await runner.cleanup()


async def _drive_session(client: aiohttp.ClientSession, proxy_url: str, upstream: SessionUpstream,
                         thresholds: Thresholds, turns: int, *, sticky: bool,
                         counter: CachingCounter) -> SessionReport:
    agent = AgentSession()
    history = [agent.first_message()]
    session_id = f"bench-agent-{'sticky' if sticky else 'recompute'}"
    soft = thresholds.soft_threshold_tokens
    rows: list[TurnRow] = []
    previous_after: int | None = None
    started = time.perf_counter()
    for turn in range(1, turns + 1):
        new = agent.next_exchange()
        history.extend(new)
        body = request_body(history, stream=False)
        parse_ms = None
        if turn % PARSE_FLOOR_EVERY == 0:
            tick = time.perf_counter()
            json.loads(body)
            parse_ms = (time.perf_counter() - tick) * 1000.0
        busy, summaries, views = upstream.busy_s, upstream.summary_calls, len(upstream.views)
        sample = await send(client, proxy_url, body, request_headers(session_id), stream=False)
        added = sample.ms - (upstream.busy_s - busy) * 1000.0
        before = _header_int(sample, "x-compact-tokens-before")
        after = _header_int(sample, "x-compact-tokens-after")
        if previous_after is None:
            crossing = before is not None and before >= soft
        else:
            growth = _capped_tokens(new, counter, thresholds.max_tool_result_tokens)
            crossing = previous_after + growth >= soft
        recompacted = False
        if len(upstream.views) > views:
            _, _, prefix_messages, previous_length = upstream.views[-1]
            recompacted = turn > 1 and prefix_messages < previous_length
        rows.append(TurnRow(turn, len(body), sample.status, added,
                            upstream.summary_calls - summaries, before, after,
                            sample.headers.get("x-compact-layers", ""), crossing, recompacted,
                            parse_ms))
        if sample.status == 200 and after is not None:
            previous_after = after
    seconds = time.perf_counter() - started
    layer_counts: Counter[str] = Counter()
    for row in rows:
        layer_counts.update(filter(None, row.layers.split(",")))
    first_crossing = next((r.turn for r in rows if r.crossing), None)
    width = max(1, math.ceil(turns / 6))
    return SessionReport(
        sticky=sticky, turns=turns,
        client_failures=sum(r.status != 200 for r in rows),
        upstream_failures=sum(n for status, n in upstream.statuses.items() if status != 200),
        forwarded_views=len(upstream.views),
        forwarded_tokens=sum(v[0] for v in upstream.views),
        cacheable_tokens=sum(v[1] for v in upstream.views),
        raw_tokens=sum(r.tokens_before or 0 for r in rows),
        summary_calls=upstream.summary_calls,
        crossings=sum(r.crossing for r in rows),
        recompactions=sum(r.recompacted for r in rows),
        layer_counts=dict(sorted(layer_counts.items())),
        buckets=_buckets(rows, width, first_crossing),
        seconds=seconds,
        rows=tuple(rows),
    )


