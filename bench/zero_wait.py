"""Zero-wait compaction (issue #33): what a crossing waits, with summaries made inline and
made ahead (``summary.prepare_at``), side by side.

    python -m bench.zero_wait [--turns 300] [--scale 0.01] [--prepare-at 0.7,0.8]
                              [--fast-prepare-at 0.8]

A Claude-Code-shaped session (``bench.proxy.AgentSession``: system and tools with their cache
breakpoints, a moving breakpoint on the last block, tool results of realistic sizes) goes
through a real ``compact-proxy serve`` process to the strict fake provider, which runs in
this process so it can time and read every request. The agent waits between requests as a
real one does (the model writing its answer, the tool running); summary calls take as long as
a real model writing ``summary.max_tokens`` tokens. Both times are real ones times
``--scale`` (the same scale for every row), so a run takes minutes, not hours.

Rows: summaries made inline (``prepare_at: null``, today), made ahead at each
``--prepare-at``, and a fast-growing session both ways (a huge tool result right after each
of the first preparations started; the inline row gets it at the same turns). Per row:

- *wait per crossing*: the client's latency minus the provider's own time for that request
  (a crossing: the forwarded view does not extend the previous one and holds a new summary:
  the crossings a summary is needed for; those the cheap layers serve wait for none either
  way); the share under 100 ms, p50 / p95 / p99 / max, and p99 over one summary call's time;
- *summary tokens*: every summary call the provider was paid for (input, cache, output),
  preparations never used included, and their ratio to the inline row;
- *cost* of the whole session (client requests and summary calls, list prices of the model)
  and the *cache-read share* of the client requests' input;
- *refused*: views the provider refused (and client-side errors);
- *lands*: the mean size of the view a crossing forwarded (the provider's input tokens);
  *base*: the median the proxy added to the other requests (what any request waits), and
  *sum $* the summary calls' share of the cost.

Not a timed test; ``tests/bench/test_zero_wait_smoke.py`` runs it with a few turns.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from aiohttp import web
from aiohttp.typedefs import Handler

from bench.proxy import (
    BENCH_API_KEY,
    SYSTEM,
    TOOLS,
    AgentSession,
    Thresholds,
    client_session,
    percentile,
    proxy_process,
)
from proxy.config.prices import DEFAULT_PRICES
from proxy.fake_upstream import FakeUpstream, SummaryTiming, start_fake_upstream

MODEL: Final = "claude-sonnet-4-5"
#: A real model: 2 s to its first token, then 50 tokens a second.
REAL_FIRST_TOKEN_S: Final = 2.0
REAL_TOKEN_S: Final = 0.02
#: A real agent turn: the model writing its answer and the tool running (seconds).
REAL_THINK_S: Final = 10.0
SUMMARY_MAX_TOKENS: Final = 2048
#: Soft 40k, L3 keeping 60 messages (a crossing needs L4), as bench/proxy.py's session part.
THRESHOLDS: Final = Thresholds(soft_threshold_tokens=40_000, hard_limit_tokens=100_000,
                               max_tool_result_tokens=2_000, keep_recent_messages=60,
                               summary_keep_recent=8)
#: The fast-growing session's huge tool result (characters: ~30k tokens).
HUGE_RESULT_CHARS: Final = 120_000
#: How many preparations are followed by a huge tool result.
FAST_INJECTIONS: Final = 3
WAIT_GOAL_MS: Final = 100.0
_MARKER: Final = b"compact-proxy-summarizer"


@dataclass
class Meter:
    """What the provider saw: its own time per client turn, summary calls and usage."""

    provider_s: dict[int, float] = field(default_factory=dict)
    forwarded_messages: dict[int, int] = field(default_factory=dict)
    summary_of: dict[int, int | None] = field(default_factory=dict)
    view_tokens: dict[int, int] = field(default_factory=dict)
    summary_s: list[float] = field(default_factory=list)
    summary_started: int = 0
    summary_usage: list[dict[str, int]] = field(default_factory=list)
    client_usage: list[dict[str, int]] = field(default_factory=list)
    refused: int = 0

    def middleware(self) -> Any:
        @web.middleware
        async def meter(request: web.Request, handler: Handler) -> web.StreamResponse:
            body = await request.read() if request.method == "POST" else b""
            summary = _MARKER in body
            if summary:
                self.summary_started += 1
            started = time.perf_counter()
            response = await handler(request)
            took = time.perf_counter() - started
            if request.path != "/v1/messages":
                return response
            if response.status >= 400:
                self.refused += 1
            usage = _usage(response)
            if summary:
                self.summary_s.append(took)
                if usage:
                    self.summary_usage.append(usage)
                return response
            turn = int(request.headers.get("x-bench-turn", "-1"))
            self.provider_s[turn] = self.provider_s.get(turn, 0.0) + took
            self.forwarded_messages[turn] = len(json.loads(body).get("messages", []))
            start = body.find(b"<compact-proxy-summary ")
            self.summary_of[turn] = (None if start < 0 else
                                     hash(body[start:body.find(b"</compact-proxy-summary>",
                                                               start)]))
            if usage:
                self.client_usage.append(usage)
                self.view_tokens[turn] = sum(int(usage.get(k) or 0) for k in (
                    "input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"))
            return response

        return meter


def _usage(response: web.StreamResponse) -> dict[str, int] | None:
    body = getattr(response, "body", None)
    if not isinstance(body, bytes | bytearray):
        return None
    try:
        usage = json.loads(body).get("usage")
    except ValueError:
        return None
    return usage if isinstance(usage, dict) else None


@dataclass(frozen=True)
class Row:
    """One session's figures."""

    name: str
    turns: int
    crossings: int
    waits_ms: tuple[float, ...]
    summary_call_ms: float
    summary_calls: int
    summary_tokens: int
    cost_usd: float
    cache_read_share: float
    refused: int
    client_errors: int
    fast_waits_ms: tuple[float, ...] = ()
    landings: tuple[int, ...] = ()
    base_ms: float = float("nan")
    summary_cost_usd: float = 0.0

    @property
    def under_goal(self) -> float:
        """Share of crossings that added less than the goal."""
        if not self.waits_ms:
            return float("nan")
        return sum(w < WAIT_GOAL_MS for w in self.waits_ms) / len(self.waits_ms)

    def p(self, q: float) -> float:
        """A percentile of the waits."""
        return percentile(self.waits_ms, q) if self.waits_ms else float("nan")


def _tokens(usage: dict[str, int]) -> int:
    return sum(int(usage.get(k) or 0) for k in ("input_tokens", "cache_read_input_tokens",
                                                 "cache_creation_input_tokens",
                                                 "output_tokens"))


def _mean(values: Sequence[int]) -> float:
    return sum(values) / len(values) if values else 0.0


def _cost(usages: Sequence[dict[str, int]]) -> float:
    price = DEFAULT_PRICES[MODEL]
    return sum(u.get("input_tokens", 0) * price.input
               + u.get("cache_creation_input_tokens", 0) * price.cache_write
               + u.get("cache_read_input_tokens", 0) * price.cache_read
               + u.get("output_tokens", 0) * price.output for u in usages) / 1e6


def _with_breakpoints(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Claude Code's moving breakpoint: ``cache_control`` on the last block of the last
    message (a copy of that message only)."""
    last = copy.deepcopy(messages[-1])
    last["content"][-1]["cache_control"] = {"type": "ephemeral"}
    return [*messages[:-1], last]


def _huge_result(turn: int) -> str:
    line = f"build.log turn {turn}: compiling module with flags -O2 -g -Wall; cached=false\n"
    return (line * (HUGE_RESULT_CHARS // len(line) + 1))[:HUGE_RESULT_CHARS]


async def run_session(name: str, workdir: Path, *, turns: int, scale: float,
                      prepare_at: float | None, fast_turns: set[int] | None = None,
                      fast_after_preparations: bool = False) -> tuple[Row, set[int]]:
    """One session through a fresh proxy; the row, and the turns that got a huge result."""
    upstream = FakeUpstream()
    upstream.summary_timing = SummaryTiming(REAL_FIRST_TOKEN_S * scale, REAL_TOKEN_S * scale,
                                            writes_max_tokens=True)
    meter = Meter()
    app_factory = upstream.make_app

    def make_app() -> web.Application:
        app = app_factory()
        app.middlewares.insert(0, meter.middleware())
        return app

    upstream.make_app = make_app  # type: ignore[method-assign]
    runner, upstream_url = await start_fake_upstream(upstream)
    tools = copy.deepcopy(TOOLS)
    tools[-1]["cache_control"] = {"type": "ephemeral"}
    session = "zero-wait-" + "".join(c if c.isalnum() else "-" for c in name)
    injected: set[int] = set()
    latencies: dict[int, float] = {}
    errors = 0
    try:
        async with client_session() as client, proxy_process(
                client, workdir, session, upstream_url, THRESHOLDS, sticky=True,
                overrides={"summary": {"prepare_at": prepare_at,
                                       "max_tokens": SUMMARY_MAX_TOKENS, "timeout_s": 120},
                           "audit": {"enabled": False}}) as proxy:
            agent = AgentSession()
            messages: list[dict[str, Any]] = [agent.first_message()]
            seen_preparations = 0
            for turn in range(1, turns + 1):
                assistant, result = agent.next_exchange()
                fresh = meter.summary_started > seen_preparations
                seen_preparations = meter.summary_started
                huge = (fast_turns is not None and turn in fast_turns) or (
                    fast_after_preparations and fresh and len(injected) < FAST_INJECTIONS)
                if huge:
                    result = copy.deepcopy(result)
                    result["content"][0]["content"] = _huge_result(turn)
                    injected.add(turn)
                messages += [assistant, result]
                body = json.dumps({"model": MODEL, "max_tokens": 1024, "system": SYSTEM,
                                   "tools": tools, "messages": _with_breakpoints(messages)})
                started = time.perf_counter()
                async with client.post(f"{proxy.url}/v1/messages", data=body, headers={
                        "x-api-key": BENCH_API_KEY, "anthropic-version": "2023-06-01",
                        "content-type": "application/json", "x-bench-turn": str(turn),
                        "x-compact-session-id": session}) as response:
                    await response.read()
                    if response.status != 200:
                        errors += 1
                latencies[turn] = time.perf_counter() - started
                await asyncio.sleep(REAL_THINK_S * scale)
            await asyncio.sleep(0.2)  # the last preparation's call, if one is running
    finally:
        await runner.cleanup()
    # A crossing that needed a summary: the view was compacted again, with a new summary.
    forwarded = meter.forwarded_messages
    crossings = [t for t in sorted(forwarded) if t > 1 and
                 forwarded[t] < forwarded.get(t - 1, 0) + 2 and
                 meter.summary_of.get(t) not in (None, meter.summary_of.get(t - 1))]
    waits = {t: max(0.0, latencies[t] - meter.provider_s.get(t, 0.0)) * 1000
             for t in crossings if t in latencies}
    base = [max(0.0, latencies[t] - meter.provider_s.get(t, 0.0)) * 1000
            for t in latencies if t not in waits and t in meter.provider_s]
    usages = meter.client_usage
    read = sum(u.get("cache_read_input_tokens", 0) for u in usages)
    total_in = sum(u.get("input_tokens", 0) + u.get("cache_read_input_tokens", 0)
                   + u.get("cache_creation_input_tokens", 0) for u in usages)
    fast_waits = tuple(w for t, w in waits.items()
                       if injected and any(0 <= t - i <= 8 for i in injected))
    row = Row(name, turns, len(crossings), tuple(waits.values()),
              (sum(meter.summary_s) / len(meter.summary_s) * 1000) if meter.summary_s
              else SummaryTiming(REAL_FIRST_TOKEN_S * scale, REAL_TOKEN_S * scale)
              .seconds({}, SUMMARY_MAX_TOKENS) * 1000,
              len(meter.summary_s), sum(map(_tokens, meter.summary_usage)),
              _cost([*usages, *meter.summary_usage]), read / total_in if total_in else 0.0,
              meter.refused, errors, fast_waits,
              tuple(meter.view_tokens[t] for t in crossings if t in meter.view_tokens),
              percentile(base, 50) if base else float("nan"), _cost(meter.summary_usage))
    return row, injected


def format_rows(rows: Sequence[Row]) -> str:
    """The rows side by side, and the goals of issue #33 for each preparing row."""
    inline = rows[0]
    lines = [f"{'row':<22}{'cross':>6}{'<100ms':>8}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}"
             f"{'max ms':>9}{'p99/call':>9}{'calls':>6}{'sum tok':>9}{'x inl':>6}"
             f"{'cost $':>8}{'sum $':>7}{'cache%':>7}{'refused':>8}{'lands':>7}{'base':>6}"]
    for row in rows:
        ratio = row.summary_tokens / inline.summary_tokens if inline.summary_tokens else 0.0
        lines.append(
            f"{row.name:<22}{row.crossings:>6}{row.under_goal * 100:>7.0f}%"
            f"{row.p(50):>9.0f}{row.p(95):>9.0f}{row.p(99):>9.0f}"
            f"{max(row.waits_ms, default=0.0):>9.0f}"
            f"{row.p(99) / row.summary_call_ms:>9.2f}{row.summary_calls:>6}"
            f"{row.summary_tokens:>9}{ratio:>6.2f}{row.cost_usd:>8.3f}{row.summary_cost_usd:>7.3f}"
            f"{row.cache_read_share * 100:>6.1f}%{row.refused + row.client_errors:>8}"
            f"{_mean(row.landings) / 1000:>6.1f}k{row.base_ms:>6.0f}")
    lines.append(f"one summary call: {inline.summary_call_ms:.0f} ms (scaled)")
    for row in rows[1:]:
        if row.fast_waits_ms:
            lines.append(f"{row.name}: crossings after a huge result waited "
                         + ", ".join(f"{w:.0f}" for w in row.fast_waits_ms) + " ms")
    return "\n".join(lines)


def goals(inline: Row, row: Row) -> list[tuple[str, bool]]:
    """Each goal of issue #33 for ``row`` against the inline row, and whether it is met."""
    return [
        ("≥95% of crossings add < 100 ms", row.under_goal >= 0.95),
        ("p99 ≤ 10% of one summary call", row.p(99) <= 0.1 * row.summary_call_ms),
        ("summary tokens ≤ 1.15× inline",
         row.summary_tokens <= 1.15 * max(1, inline.summary_tokens)),
        ("cost no worse than inline", row.cost_usd <= inline.cost_usd * 1.0 + 1e-9),
        ("cache-read share no worse", row.cache_read_share >= inline.cache_read_share - 1e-9),
        ("0 views refused", row.refused + row.client_errors == 0),
    ]


async def measure(turns: int, scale: float, prepare_ats: Sequence[float],
                  fast_prepare_at: float | None) -> list[Row]:
    """Every row of the report (the inline row first)."""
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="zero-wait-") as tmp:
        workdir = Path(tmp)
        inline, _ = await run_session("inline", workdir, turns=turns, scale=scale,
                                      prepare_at=None)
        rows.append(inline)
        for value in prepare_ats:
            row, _ = await run_session(f"prepared@{value:g}", workdir, turns=turns, scale=scale,
                                       prepare_at=value)
            rows.append(row)
        if fast_prepare_at is not None:
            fast, injected = await run_session(
                f"fast prepared@{fast_prepare_at:g}", workdir, turns=turns, scale=scale,
                prepare_at=fast_prepare_at, fast_after_preparations=True)
            fast_inline, _ = await run_session("fast inline", workdir, turns=turns,
                                               scale=scale, prepare_at=None,
                                               fast_turns=injected)
            rows += [fast_inline, fast]
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--scale", type=float, default=0.01,
                        help="real time x this (summary calls and the agent's own time)")
    parser.add_argument("--prepare-at", default="0.7,0.8",
                        help="comma-separated summary.prepare_at values, one row each")
    parser.add_argument("--fast-prepare-at", type=float, default=0.8,
                        help="prepare_at of the fast-growing rows (0: no such rows)")
    args = parser.parse_args(argv)
    prepare_ats = [float(v) for v in args.prepare_at.split(",") if v.strip()]
    rows = asyncio.run(measure(args.turns, args.scale, prepare_ats,
                               args.fast_prepare_at or None))
    print(f"zero-wait compaction: {args.turns} turns, time scale {args.scale:g} "
          f"(summary call = {REAL_FIRST_TOKEN_S:g} s + {SUMMARY_MAX_TOKENS} x "
          f"{REAL_TOKEN_S * 1000:g} ms real; agent turn {REAL_THINK_S:g} s real)")
    print(format_rows(rows))
    for row in rows[1:]:
        if row.name.startswith("fast"):
            continue
        print(f"goals, {row.name}: " + "; ".join(
            f"{name}: {'met' if ok else 'NOT met'}" for name, ok in goals(rows[0], row)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
