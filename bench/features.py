"""What each bookkeeping feature costs: the proxy's CPU per request with it on and off.

    python -m bench.features [--requests 300] [--size 50000] [--pace-ms 20] [--block 1]
                             [--baseline REF] [--redis URL]

One run starts the fake provider, the bare relay (``bench/proxy.py --null-relay``) and one
``serve`` process per variant of ``bench/proxy.py``'s config (sticky, tiktoken, the audit log
on): every feature on, then each of the request path's bookkeeping features off on its own —
the audit log (``audit.enabled``), the ``request_completed`` line (``logging.level: warning``),
calibration (``compaction.calibration``) — then all three off; and one more with every
feature on whose session holds a durable state (:func:`seed_durable_state`: facts pointing
into the session's transcript and pending items on an artifact, each pointer verified again
on every request and the block appended to ``system``). The same request of ``--size``
bytes under the threshold (``bench/proxy.py``'s CPU cell) goes to every process in turn,
``--pace-ms`` apart, ``--requests`` times; it prints each process's CPU per request (``/proc``)
and its ratio to the relay's. What a feature costs is the difference between "all on" and its
own row, measured in one interleaved run.

``--block N`` sends each process N requests in a row before the next one's turn (with
``--pace-ms 0``: a hop that serves a stream of requests, its caches warm — paced one by one,
every request starts cold); ``--baseline REF`` adds the proxy of git ref ``REF`` (a temporary
worktree, every feature on; and its durable-state process), so a change of a few percent is
read old against new in one run; ``--redis URL`` one more process (and the baseline's) whose
store is that Redis (each with a session of its own there).
Not a timed test; ``tests/bench/test_features_smoke.py`` checks its structure at a tiny size.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import compactor
from bench.harness.client import client_session, send
from bench.harness.config import SESSION_THRESHOLDS
from bench.harness.processes import baseline_worktree, proxy_process, upstream_process
from bench.harness.relay import relay_process
from bench.harness.stats import process_cpu_s
from bench.harness.workloads import history_of_size, request_body, request_headers
from proxy.store import SQLiteStateStore

#: The variants: a name and what it changes in the config.
VARIANTS: Final[tuple[tuple[str, Mapping[str, Any]], ...]] = (
    ("all on", {}),
    ("audit log off", {"audit": {"enabled": False}}),
    ("request line off", {"logging": {"level": "warning"}}),
    ("calibration off", {"compaction": {"calibration": False}}),
    ("all three off", {"audit": {"enabled": False}, "logging": {"level": "warning"},
                       "compaction": {"calibration": False}}),
)
#: The session every request belongs to.
SESSION: Final = "bench-features"
#: The durable state one more process (every feature on) holds for the session: facts that
#: point into the session's transcript, pending items on one artifact (SPEC section 4, step 4:
#: each pointer verified on every request, the block appended to ``system``).
DURABLE_FACTS: Final = 8
DURABLE_PENDING: Final = 2
#: Events in the session's transcript.
TRANSCRIPT_EVENTS: Final = 200
#: Untimed requests per process before the counts start (connections, caches, the session).
WARMUP: Final = 20
#: How long the processes are left to finish a request's tail before CPU is read.
SETTLE_S: Final = 0.3


@dataclass(frozen=True)
class FeatureCosts:
    """CPU ms per request of the relay and of each variant (in :data:`VARIANTS` order)."""

    body_bytes: int
    requests: int
    relay_ms: float
    variant_ms: dict[str, float]
    baseline_ms: float | None = None
    baseline_ref: str | None = None
    #: Every feature on, the session holding a durable state of ``pointers`` pointers (and
    #: the baseline's, when there is one).
    durable_ms: float = 0.0
    baseline_durable_ms: float | None = None
    pointers: int = 0
    #: Every feature on, the store on Redis (``--redis``; and the baseline's).
    redis_ms: float | None = None
    baseline_redis_ms: float | None = None

    def ratio(self, name: str) -> float:
        """A variant's CPU per request over the relay's."""
        return self.variant_ms[name] / self.relay_ms

    def saved(self, name: str) -> float:
        """What turning the variant's features off saves per request (ms)."""
        return self.variant_ms[VARIANTS[0][0]] - self.variant_ms[name]


async def measure(size: int, requests: int, pace_s: float, *, block: int = 1,
                  baseline: str | None = None, redis: str | None = None) -> FeatureCosts:
    """Run every process and time the same request against each in turn, ``block`` requests
    at a time (see the module); ``baseline``: a git ref whose proxy runs too; ``redis``: a
    Redis URL whose store one more process (and the baseline's) uses."""
    if block < 1 or requests % block:
        raise ValueError(f"--block must divide --requests ({requests}), got {block}")
    with tempfile.TemporaryDirectory(prefix="compact-proxy-features-") as tmp, \
            (baseline_worktree(baseline, Path(tmp) / "baseline") if baseline is not None
             else nullcontext()) as baseline_source:
        work = Path(tmp)
        async with client_session() as client, AsyncExitStack() as stack:
            upstream = await stack.enter_async_context(upstream_process(client, work))
            services = {"relay": await stack.enter_async_context(
                relay_process(client, work, upstream.url))}
            for name, change in VARIANTS:
                services[name] = await stack.enter_async_context(proxy_process(
                    client, work, name.replace(" ", "-"), upstream.url, SESSION_THRESHOLDS,
                    sticky=True, overrides=change))
            pointers = await seed_durable_state(work / _DURABLE, SESSION)
            services[_DURABLE] = await stack.enter_async_context(proxy_process(
                client, work, _DURABLE, upstream.url, SESSION_THRESHOLDS, sticky=True))
            if baseline_source is not None:
                services[_BASELINE] = await stack.enter_async_context(proxy_process(
                    client, work, _BASELINE, upstream.url, SESSION_THRESHOLDS, sticky=True,
                    source=baseline_source))
                await seed_durable_state(work / _BASELINE_DURABLE, SESSION)
                services[_BASELINE_DURABLE] = await stack.enter_async_context(proxy_process(
                    client, work, _BASELINE_DURABLE, upstream.url, SESSION_THRESHOLDS,
                    sticky=True, source=baseline_source))
            if redis is not None:
                on_redis = {"store": {"backend": "redis", "url": redis}}
                services[_REDIS] = await stack.enter_async_context(proxy_process(
                    client, work, _REDIS, upstream.url, SESSION_THRESHOLDS, sticky=True,
                    overrides=on_redis))
                if baseline_source is not None:
                    services[_BASELINE_REDIS] = await stack.enter_async_context(proxy_process(
                        client, work, _BASELINE_REDIS, upstream.url, SESSION_THRESHOLDS,
                        sticky=True, overrides=on_redis, source=baseline_source))
            body = request_body(history_of_size(size), stream=False)
            # A Redis store outlives the run and is shared: each process there has a session
            # of its own.
            run = uuid.uuid4().hex[:12]
            sessions = {name: f"{SESSION}-{name}-{run}" if name in (_REDIS, _BASELINE_REDIS)
                        else SESSION for name in services}
            for name, service in services.items():
                for _ in range(WARMUP):
                    await send(client, service.url, body, request_headers(sessions[name]),
                               stream=False)
            await asyncio.sleep(SETTLE_S)
            before = {name: process_cpu_s(s.process.pid) for name, s in services.items()}
            for _ in range(requests // block):
                for name, service in services.items():
                    headers = request_headers(sessions[name])
                    for _ in range(block):
                        sample = await send(client, service.url, body, headers, stream=False)
                        if sample.status != 200:
                            raise RuntimeError(f"{name}: HTTP {sample.status}")
                        if pace_s:
                            await asyncio.sleep(pace_s)
            await asyncio.sleep(SETTLE_S)
            cpu = {name: (process_cpu_s(s.process.pid) - before[name]) * 1000 / requests
                   for name, s in services.items()}
    relay = cpu.pop("relay")
    baseline_ms = cpu.pop(_BASELINE, None)
    baseline_durable_ms = cpu.pop(_BASELINE_DURABLE, None)
    durable_ms = cpu.pop(_DURABLE)
    redis_ms = cpu.pop(_REDIS, None)
    baseline_redis_ms = cpu.pop(_BASELINE_REDIS, None)
    return FeatureCosts(len(body), requests, relay, cpu, baseline_ms, baseline, durable_ms,
                        baseline_durable_ms, pointers, redis_ms, baseline_redis_ms)


#: The measured processes beyond the variants: their keys (and their folders' names).
_DURABLE: Final = "durable-state"
_BASELINE: Final = "baseline"
_BASELINE_DURABLE: Final = "baseline-durable-state"
_REDIS: Final = "redis-store"
_BASELINE_REDIS: Final = "baseline-redis-store"


async def seed_durable_state(directory: Path, session_id: str) -> int:
    """Give ``session_id`` a durable state in the store of the proxy whose files are under
    ``directory`` (:func:`bench.harness.config.write_proxy_config`'s layout, written before the
    proxy starts), with its transcript and artifact in the proxy's roots; returns how many distinct
    pointers the state holds."""
    transcripts = directory / "transcripts"
    artifacts = directory / "artifacts" / session_id
    transcripts.mkdir(parents=True, exist_ok=True)
    artifacts.mkdir(parents=True, exist_ok=True)
    events = [json.dumps({"sequence": n, "session_id": session_id, "event_id": f"e{n}",
                          "type": "message", "text": f"event {n}: " + "x" * 200})
              for n in range(1, TRANSCRIPT_EVENTS + 1)]
    (transcripts / f"{session_id}.jsonl").write_text("\n".join(events) + "\n", encoding="utf-8")
    report = b"all tests passed\n" * 500
    (artifacts / "report.txt").write_bytes(report)
    digest = hashlib.sha256(report).hexdigest()
    now = datetime.now(UTC)
    step = TRANSCRIPT_EVENTS // DURABLE_FACTS
    state = compactor.DurableContextState(
        facts=tuple(compactor.DurableFact(f"f{n}", f"fact number {n}",
                                          f"transcript:{session_id}:{1 + n * step}", now)
                    for n in range(DURABLE_FACTS)),
        pending_items=tuple(compactor.PendingItem(f"p{n}", f"pending item {n}",
                                                  f"artifact:{session_id}:report.txt:{digest}",
                                                  now)
                            for n in range(DURABLE_PENDING)))
    store = await SQLiteStateStore(directory / "state.db").open()
    try:
        await store.put_state(session_id, state, None)
    finally:
        await store.close()
    return len(state.source_pointers())


def format_costs(costs: FeatureCosts, pace_ms: float, block: int = 1) -> str:
    """The table: a row per process, CPU per request, ratio to the relay, what a variant saves
    (a durable state: what it costs, negative) against every feature on."""
    turns = "interleaved" if block == 1 else f"interleaved in blocks of {block}"
    everything = costs.variant_ms[VARIANTS[0][0]]
    rows: list[tuple[str, float, float | None]] = [("bare relay", costs.relay_ms, None)]
    rows += [(f"proxy, {name}", costs.variant_ms[name],
              None if name == VARIANTS[0][0] else costs.saved(name)) for name, _ in VARIANTS]
    rows.append((f"proxy, durable state ({costs.pointers} pointers)", costs.durable_ms,
                 everything - costs.durable_ms))
    if costs.baseline_ms is not None:
        rows.append((f"baseline {costs.baseline_ref}, all on", costs.baseline_ms, None))
    if costs.baseline_durable_ms is not None:
        rows.append((f"baseline {costs.baseline_ref}, durable state", costs.baseline_durable_ms,
                     None))
    if costs.redis_ms is not None:
        rows.append(("proxy, Redis store", costs.redis_ms, everything - costs.redis_ms))
    if costs.baseline_redis_ms is not None:
        rows.append((f"baseline {costs.baseline_ref}, Redis store", costs.baseline_redis_ms,
                     None))
    width = max(len(label) for label, _, _ in rows) + 2
    lines = [f"CPU per request, {costs.body_bytes / 1000:.0f} KB under the threshold "
             f"({costs.requests} requests per process, {turns}, {pace_ms:g} ms apart)",
             f"   {'process':<{width}}{'ms':>8}{'x relay':>10}{'saves':>9}"]
    for label, ms, saved in rows:
        lines.append(f"   {label:<{width}}{ms:>8.3f}{ms / costs.relay_ms:>10.2f}"
                     + ("" if saved is None else f"{saved:>9.3f}"))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run and print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--size", type=int, default=50_000, help="history size in bytes")
    parser.add_argument("--pace-ms", type=float, default=20.0)
    parser.add_argument("--block", type=int, default=1,
                        help="requests in a row per process before the next one's turn")
    parser.add_argument("--baseline", metavar="REF",
                        help="also the proxy of this git ref (a temporary worktree)")
    parser.add_argument("--redis", metavar="URL",
                        help="also a proxy (and the baseline's) whose store is this Redis")
    args = parser.parse_args(argv)
    costs = asyncio.run(measure(args.size, args.requests, args.pace_ms / 1000,
                                block=args.block, baseline=args.baseline, redis=args.redis))
    print(format_costs(costs, args.pace_ms, args.block))
    return 0


if __name__ == "__main__":
    sys.exit(main())
