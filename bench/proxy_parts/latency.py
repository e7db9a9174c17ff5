"""Parts 1-3 of ``bench/proxy.py``: added latency and own time, interleaved over
every target, for small and large, warm and cold histories."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Final

import aiohttp

from bench.harness.client import Sample, send
from bench.harness.config import BenchError, Sizes
from bench.harness.stats import Dist, fmt_kb, process_cpu_ns
from bench.harness.workloads import history_of_size, request_body, request_headers, tiny_exchange

#: The reference relay on uvloop, the proxy's default loop (``listen.event_loop``): a target
#: of the small cells and of the throughput part, next to the relay on asyncio's own loop.
RELAY_UVLOOP: Final = "relay-uvloop"
WARM_BLOCK: Final = 40  # timed requests per session of a warm cell (then a new session)
COLD_SEED: Final = 7_000_000  # the cold cell's histories: COLD_SEED + round, never seen before
CPU_SETTLE_S: Final = 0.05  # after a cell, before its hops' CPU is read again


@dataclass(frozen=True)
class Targets:
    """Where the latency and throughput parts send: the proxy, the provider directly, the
    reference relay, and any further hops (``extra``: LiteLLM, a baseline proxy).

    ``relay`` is :func:`serve_null_relay` in its own process: an aiohttp reverse proxy that
    only forwards bytes, the floor any Python proxy hop costs on this machine (``None``:
    not measured). ``pids`` maps a target's name to its hop's process id, so a cell can say
    how much CPU each hop spent per request (the provider's is not split by target).
    """

    proxy: str
    direct: str
    relay: str | None = None
    extra: tuple[tuple[str, str], ...] = ()
    pids: tuple[tuple[str, int], ...] = ()

    def named(self) -> list[tuple[str, str]]:
        """Every target as ``(name, base URL)``."""
        named = [("proxy", self.proxy), ("direct", self.direct)]
        if self.relay is not None:
            named.append(("relay", self.relay))
        return named + list(self.extra)

    def rotation(self, index: int) -> list[tuple[str, str]]:
        """The targets in the order to call them for round ``index`` (rotating)."""
        named = self.named()
        shift = index % len(named)
        return named[shift:] + named[:shift]

    def only(self, *extra: str) -> Targets:
        """These targets with only the named extra hops (the others left out)."""
        return replace(self, extra=tuple((n, u) for n, u in self.extra if n in extra))


@dataclass(frozen=True)
class LatencyCell:
    """One latency cell: the same requests to every target, interleaved.

    ``added_p50`` / ``added_p99`` are the proxy's percentile minus the direct one;
    ``relay`` is the reference relay's distribution (``relay_added_*`` likewise).
    ``others`` holds the extra hops' latency (LiteLLM, a baseline), ``own`` every target's
    own time (client latency minus the provider's reported time), ``cpu_ms`` the CPU
    milliseconds per timed request of each hop process (proxy, relay, extras).
    """

    label: str
    stream: bool
    direct: Dist
    proxy: Dist
    failures: int
    tokens_before: int | None = None
    tokens_after: int | None = None
    layers: str = ""
    relay: Dist | None = None
    others: dict[str, Dist] = field(default_factory=dict)
    own: dict[str, Dist] = field(default_factory=dict)
    cpu_ms: dict[str, float] = field(default_factory=dict)
    body_bytes: int = 0

    @property
    def added_p50(self) -> float:
        """Added milliseconds at the median."""
        return self.proxy.p50 - self.direct.p50

    @property
    def added_p99(self) -> float:
        """Added milliseconds at the 99th percentile."""
        return self.proxy.p99 - self.direct.p99

    @property
    def relay_added_p50(self) -> float:
        """What the bare relay adds at the median (NaN when not measured)."""
        return math.nan if self.relay is None else self.relay.p50 - self.direct.p50

    @property
    def relay_added_p99(self) -> float:
        """What the bare relay adds at the 99th percentile (NaN when not measured)."""
        return math.nan if self.relay is None else self.relay.p99 - self.direct.p99

    def latency(self, target: str) -> Dist | None:
        """The client latency of ``target`` (``direct``, ``relay``, ``proxy`` or an extra)."""
        if target == "direct":
            return self.direct
        if target == "proxy":
            return self.proxy
        if target == "relay":
            return self.relay
        return self.others.get(target)

    def own_p50(self, target: str) -> float:
        """``target``'s own time at the median (NaN when not measured)."""
        dist = self.own.get(target)
        return math.nan if dist is None else dist.p50

    @property
    def targets(self) -> list[str]:
        """The targets measured in this cell, in report order."""
        names = ["direct", *(["relay"] if self.relay is not None else []), "proxy"]
        return names + list(self.others)


async def _round(client: aiohttp.ClientSession, targets: Targets, body: bytes, session_id: str,
                 stream: bool, index: int) -> dict[str, Sample]:
    """The same body to every target, one after the other, the order rotating."""
    headers = request_headers(session_id)
    return {name: await send(client, url, body, headers, stream=stream)
            for name, url in targets.rotation(index)}


def _header_int(sample: Sample, name: str) -> int | None:
    value = sample.headers.get(name)
    return int(value) if value is not None and value.isdigit() else None


@dataclass
class _Tally:
    """What the timed requests of one cell collected so far (one or more segments)."""

    times: dict[str, list[float]]
    own: dict[str, list[float]]
    cpu_ns: dict[str, float]
    failures: int = 0
    last: Sample | None = None
    size: int = 0

    @classmethod
    def of(cls, targets: Targets) -> _Tally:
        """An empty tally for ``targets``."""
        names = [name for name, _ in targets.named()]
        return cls({name: [] for name in names}, {name: [] for name in names},
                   {name: 0.0 for name, _ in targets.pids if name in names})


async def _timed(client: aiohttp.ClientSession, targets: Targets, bodies: Iterable[bytes],
                 tally: _Tally, *, stream: bool, session_id: str | Callable[[int], str]) -> None:
    """Time every body of ``bodies`` against every target, interleaved, into ``tally``; the
    hops' CPU is read before and after (``session_id``: one for all, or one per round)."""
    pids = {name: pid for name, pid in targets.pids if name in tally.cpu_ns}
    cpu_before = {name: process_cpu_ns(pid) for name, pid in pids.items()}
    for index, body in enumerate(bodies):
        tally.size = len(body)
        session = session_id(index) if callable(session_id) else session_id
        samples = await _round(client, targets, body, session, stream, index)
        for name, sample in samples.items():
            tally.failures += sample.status != 200
            tally.times[name].append(sample.ms)
            if not math.isnan(sample.own_ms):
                tally.own[name].append(sample.own_ms)
        tally.last = samples["proxy"]
    await asyncio.sleep(CPU_SETTLE_S)  # work a hop does right after its answer counts too
    for name, pid in pids.items():
        tally.cpu_ns[name] += process_cpu_ns(pid) - cpu_before[name]


def _finish(tally: _Tally, targets: Targets, *, label: str, stream: bool) -> LatencyCell:
    last, count = tally.last, len(tally.times["proxy"])
    if last is None or not count:
        raise BenchError(f"{label}: no requests")
    times = tally.times
    return LatencyCell(label, stream, Dist.of(times["direct"]), Dist.of(times["proxy"]),
                       tally.failures,
                       _header_int(last, "x-compact-tokens-before"),
                       _header_int(last, "x-compact-tokens-after"),
                       last.headers.get("x-compact-layers", ""),
                       Dist.of(times["relay"]) if targets.relay is not None else None,
                       {name: Dist.of(times[name]) for name, _ in targets.extra},
                       {name: Dist.of(values) for name, values in tally.own.items() if values},
                       {name: ns / 1e6 / count for name, ns in tally.cpu_ns.items()},
                       tally.size)


async def _cell(client: aiohttp.ClientSession, targets: Targets, bodies: Iterable[bytes], *,
                stream: bool, label: str, session_id: str | Callable[[int], str]) -> LatencyCell:
    """Time every body of ``bodies`` against every target, interleaved, as one cell."""
    tally = _Tally.of(targets)
    await _timed(client, targets, bodies, tally, stream=stream, session_id=session_id)
    return _finish(tally, targets, label=label, stream=stream)


async def _fixed_cell(client: aiohttp.ClientSession, targets: Targets,
                      messages: list[dict[str, Any]], requests: int, *, stream: bool,
                      label: str, session_id: str) -> LatencyCell:
    """The same request every time (a session re-asking under the threshold)."""
    body = request_body(messages, stream=stream)
    for index in range(4):  # warm connections and caches, untimed
        await _round(client, targets, body, session_id, stream, index)
    return await _cell(client, targets, (body for _ in range(requests)), stream=stream,
                       label=label, session_id=session_id)


async def _growing_cell(client: aiohttp.ClientSession, targets: Targets,
                        messages: list[dict[str, Any]], requests: int, *, stream: bool,
                        label: str, session_id: str) -> LatencyCell:
    """Sessions whose history grows by one small exchange per request, warm: each session's
    first compaction (L4 included) and three warm-ups happen before its timed requests.

    A session serves at most :data:`WARM_BLOCK` timed requests, then the next one starts from
    ``messages`` again, so the history stays near its nominal size however many requests are
    timed (300 grown exchanges would add 600 messages, and the 50 KB cell would measure those).
    """
    tally = _Tally.of(targets)
    for block, start in enumerate(range(0, requests, WARM_BLOCK)):
        session = f"{session_id}-{block}"
        history = list(messages)
        cold = await send(client, targets.proxy, request_body(history, stream=stream),
                          request_headers(session), stream=stream)
        if cold.status != 200:
            raise BenchError(f"{label}: the cold request got HTTP {cold.status}")

        def grown_bodies(count: int, history: list[dict[str, Any]] = history) -> Iterable[bytes]:
            for _ in range(count):
                history.extend(tiny_exchange(len(history)))
                yield request_body(history, stream=stream)

        for index, body in enumerate(grown_bodies(3)):  # warm-ups, untimed
            await _round(client, targets, body, session, stream, index)
        await _timed(client, targets, grown_bodies(min(WARM_BLOCK, requests - start)), tally,
                     stream=stream, session_id=session)
    return _finish(tally, targets, label=label, stream=stream)


async def _cold_cell(client: aiohttp.ClientSession, targets: Targets, size: int,
                     requests: int, *, label: str, tag: str) -> LatencyCell:
    """The first request of a session, every time: per round a history of ``size`` bytes no
    process has seen (the agent session with another seed) under a new session id, so every
    proxy compacts it from scratch (a summary call included, if its layers need one) and
    nothing it cached by content (token counts, fingerprints) helps."""
    def body(round_index: int) -> bytes:
        return request_body(history_of_size(size, seed=COLD_SEED + round_index), stream=False)

    # Connections and lazy imports, untimed.
    await _round(client, targets, body(requests), f"bench-{tag}-warmup", False, 0)
    return await _cell(client, targets, (body(index) for index in range(requests)),
                       stream=False, label=label,
                       session_id=lambda index: f"bench-{tag}-{index}")




async def measure_latency(client: aiohttp.ClientSession, targets: Targets,
                          sizes: Sizes) -> list[LatencyCell]:
    """Part 1: the four cells (small/large × json/stream).

    LiteLLM (``litellm``) and the relay on uvloop (:data:`RELAY_UVLOOP`) are timed in the
    small cells; a baseline proxy (``baseline``) in the small cells and the large json one,
    where its CPU per request is read.
    """
    small = history_of_size(sizes.small_bytes)
    large = history_of_size(sizes.large_bytes)
    small_label = f"{fmt_kb(sizes.small_bytes)}, under threshold"
    large_label = f"{fmt_kb(sizes.large_bytes)} history, warm"
    cells = []
    for stream in (False, True):
        kind = "stream" if stream else "json"
        cells.append(await _fixed_cell(client, targets.only("litellm", "baseline", RELAY_UVLOOP),
                                       small, sizes.latency_requests, stream=stream,
                                       label=f"{small_label}, {kind}",
                                       session_id=f"bench-small-{kind}"))
    for stream in (False, True):
        kind = "stream" if stream else "json"
        extras = ("baseline",) if not stream else ()
        cells.append(await _growing_cell(client, targets.only(*extras), large,
                                         sizes.latency_requests, stream=stream,
                                         label=f"{large_label}, {kind}",
                                         session_id=f"bench-large-{kind}"))
    return cells


async def measure_warm_sizes(client: aiohttp.ClientSession, targets: Targets, sizes: Sizes,
                             middle: LatencyCell) -> list[LatencyCell]:
    """Part 2: warm JSON cells at the small, the large (``middle``, part 1's cell) and the
    huge size: a growing history, compacted once before the timed requests."""
    cells = []
    for size in (sizes.small_bytes, sizes.huge_bytes):
        label = f"{fmt_kb(size)} history, warm, json"
        cells.append(await _growing_cell(client, targets.only(), history_of_size(size),
                                         sizes.latency_requests, stream=False, label=label,
                                         session_id=f"bench-warm-{size}"))
    return [cells[0], middle, cells[1]]


async def measure_cold(client: aiohttp.ClientSession, targets: Targets,
                       sizes: Sizes) -> LatencyCell:
    """Part 3: the first request of a session with a ``sizes.cold_bytes`` history."""
    return await _cold_cell(client, targets.only("baseline"), sizes.cold_bytes,
                            sizes.cold_requests, label=f"{fmt_kb(sizes.cold_bytes)} history, cold",
                            tag="cold")


# -- part 2: throughput -----------------------------------------------------------------------


def cell_cpu(cell: LatencyCell | None, target: str) -> float:
    """``target``'s CPU ms per request in ``cell`` (NaN when not measured)."""
    return math.nan if cell is None else cell.cpu_ms.get(target, math.nan)
