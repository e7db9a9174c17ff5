"""The benchmarks' HTTP client.

One request sent and timed as a :class:`Sample`: latency, first byte, the stamped stream
events, and the provider's own time as it reported it.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp

from bench.harness.config import REQUEST_TIMEOUT_S
from bench.stamped_upstream import PROVIDER_MS_FIELD, PROVIDER_MS_HEADER, STAMP_FIELD

_STAMP_RE: Final = re.compile(rb'"' + STAMP_FIELD.encode() + rb'":(\d+)')
_PROVIDER_MS_RE: Final = re.compile(rb'"' + PROVIDER_MS_FIELD.encode() + rb'":\s*([0-9.]+)')
# LiteLLM hands the provider's headers on with this prefix (streams only).
_PROVIDER_HEADER_PREFIXES: Final = ("", "llm_provider-")


def client_session() -> aiohttp.ClientSession:
    """The benchmark's HTTP client: keep-alive, no connection limit, bounded per request."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, limit_per_host=0),
        timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S, sock_connect=10),
    )


# -- measuring one request --------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """One request as the client saw it.

    Attributes:
        status: the HTTP status.
        ms: request start to last byte, milliseconds.
        first_ms: request start to the first body chunk (streams), milliseconds.
        headers: the ``x-compact-*`` response headers.
        events: per stamped SSE event, ``(provider's send stamp, client receive time)`` in
            ``time.time_ns()``.
        provider_ms: the milliseconds the provider spent on the request, as it reported them
            (``x-bench-provider-ms``, else the last ``bench_provider_ms`` field of the answer).
    """

    status: int
    ms: float
    first_ms: float | None = None
    headers: dict[str, str] = field(default_factory=dict)
    events: tuple[tuple[int, int], ...] = ()
    provider_ms: float | None = None

    @property
    def own_ms(self) -> float:
        """Client latency minus the provider's own time for this request (NaN when the
        provider's time did not come back)."""
        return math.nan if self.provider_ms is None else self.ms - self.provider_ms

    @property
    def relay_ms(self) -> tuple[float, ...]:
        """Per stamped event: client receive time minus the provider's send stamp, in ms."""
        return tuple((received - sent) / 1e6 for sent, received in self.events)


async def send(client: aiohttp.ClientSession, base_url: str, body: bytes,
               headers: dict[str, str], *, stream: bool) -> Sample:
    """POST ``body`` to ``/v1/messages`` and read the whole answer, timing it."""
    start = time.perf_counter()
    first: float | None = None
    received = bytearray()
    arrivals: list[tuple[int, int]] = []  # (end offset in the stream, receive time ns)
    async with client.post(f"{base_url}/v1/messages", data=body, headers=headers) as response:
        if stream:
            async for chunk in response.content.iter_any():
                now_ns = time.time_ns()
                if first is None:
                    first = time.perf_counter()
                received += chunk
                arrivals.append((len(received), now_ns))
        else:
            received += await response.read()
        end = time.perf_counter()
        compact = {k.lower(): v for k, v in response.headers.items()
                   if k.lower().startswith("x-compact-")}
        status = response.status
        provider_ms = provider_ms_of(response.headers, received)
    events: list[tuple[int, int]] = []
    if arrivals:
        # Each stamp was received with the chunk that completed it.
        position = 0
        for match in _STAMP_RE.finditer(received):
            while arrivals[position][0] < match.end():
                position += 1
            events.append((int(match.group(1)), arrivals[position][1]))
    return Sample(status, (end - start) * 1000.0,
                  None if first is None else (first - start) * 1000.0, compact, tuple(events),
                  provider_ms)


def provider_ms_of(headers: Any, body: bytes | bytearray) -> float | None:
    """The provider's own time: its header (possibly renamed by the hop), else the last
    ``bench_provider_ms`` field of the answer (a stream's last event has the whole time)."""
    for prefix in _PROVIDER_HEADER_PREFIXES:
        value = headers.get(prefix + PROVIDER_MS_HEADER)
        if value is not None:
            try:
                return float(value)
            except ValueError:
                pass
    found = _PROVIDER_MS_RE.findall(body)
    return float(found[-1]) if found else None


# -- statistics -------------------------------------------------------------------------------
