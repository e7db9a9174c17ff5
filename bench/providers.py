"""What the Bedrock and Vertex paths cost next to the first-party one: the proxy's CPU per
request (issue #36: Bedrock within 15 % of first-party).

    python -m bench.providers [--requests 200] [--size 50000] [--pace-ms 10] [--stream]

One run starts the strict fake provider speaking Bedrock, Vertex and the first-party API
(``compact-proxy fake-upstream --provider …``, one process each) and one ``serve`` process per
provider (``bench/proxy.py``'s config, ``upstream.provider`` set; Bedrock signs with the fake's
test key pair, Vertex sends a token from the environment). The same conversation of ``--size``
bytes under the threshold goes to each in its own format (``/v1/messages``,
``/model/{id}/invoke[-with-response-stream]``, ``…:rawPredict`` / ``:streamRawPredict``), the
processes taken in turn, ``--requests`` times; it prints each proxy's CPU per request
(``/proc``) and its ratio to the first-party proxy's. Not a timed test;
``tests/bench/test_providers_smoke.py`` runs it at a tiny size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp
from yarl import URL

from bench.proxy import (
    BENCH_API_KEY,
    SESSION_THRESHOLDS,
    ManagedProcess,
    Service,
    _wait_until_up,
    client_session,
    free_port,
    history_of_size,
    process_cpu_s,
    request_body,
    write_proxy_config,
)
from proxy.fake_upstream.credentials import (
    TEST_AWS_ACCESS_KEY,
    TEST_AWS_SECRET_KEY,
    TEST_VERTEX_TOKEN,
)

PROVIDERS: Final = ("anthropic", "bedrock", "vertex")
BEDROCK_MODEL: Final = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
VERTEX_PATH: Final = ("/projects/bench/locations/us-east5/publishers/anthropic/models/"
                      "claude-sonnet-4-5@20250929")
WARMUP: Final = 10
SETTLE_S: Final = 0.3
_PROXY_ENV: Final = {
    "AWS_ACCESS_KEY_ID": TEST_AWS_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": TEST_AWS_SECRET_KEY,
    "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
    "AWS_EC2_METADATA_DISABLED": "true", "BENCH_VERTEX_TOKEN": TEST_VERTEX_TOKEN,
}


@dataclass(frozen=True)
class ProviderCosts:
    """CPU ms per request of the proxy in front of each provider."""

    body_bytes: int
    requests: int
    stream: bool
    cpu_ms: dict[str, float]

    def ratio(self, provider: str) -> float:
        """A provider's CPU per request over the first-party proxy's."""
        return self.cpu_ms[provider] / self.cpu_ms["anthropic"]


def provider_request(provider: str, body: bytes, stream: bool) -> tuple[str, bytes,
                                                                         dict[str, str]]:
    """The first-party request ``body`` in ``provider``'s format: path, bytes, headers."""
    if provider == "anthropic":
        return "/v1/messages", body, {"x-api-key": BENCH_API_KEY,
                                      "anthropic-version": "2023-06-01"}
    doc: dict[str, Any] = json.loads(body)
    doc.pop("model")
    if provider == "bedrock":
        doc.pop("stream", None)
        doc["anthropic_version"] = "bedrock-2023-05-31"
        action = "invoke-with-response-stream" if stream else "invoke"
        path = f"/model/{BEDROCK_MODEL}/{action}"
    else:
        doc["anthropic_version"] = "vertex-2023-10-16"
        path = f"{VERTEX_PATH}:{'streamRawPredict' if stream else 'rawPredict'}"
    return path, json.dumps(doc, separators=(",", ":")).encode(), {}


@asynccontextmanager
async def _fake(client: aiohttp.ClientSession, work: Path,
                provider: str) -> AsyncIterator[Service]:
    port = free_port()
    process = ManagedProcess(f"fake-{provider}", [
        sys.executable, "-m", "proxy.cli", "fake-upstream", "--port", str(port),
        "--provider", provider], work / f"fake-{provider}.log")
    process.start()
    try:
        url = f"http://127.0.0.1:{port}"
        await _wait_until_up(client, process, f"{url}/v1/models", {"x-api-key": "bench"})
        yield Service(url, process)
    finally:
        process.stop()


@asynccontextmanager
async def _proxy(client: aiohttp.ClientSession, work: Path, provider: str,
                 upstream_url: str) -> AsyncIterator[Service]:
    port = free_port()
    settings: dict[str, Any] = {"provider": provider}
    if provider == "bedrock":
        settings["aws_region"] = "us-east-1"
    elif provider == "vertex":
        settings["vertex_token_env"] = "BENCH_VERTEX_TOKEN"
    config = write_proxy_config(work / provider, upstream_url, SESSION_THRESHOLDS, sticky=True,
                                port=port, overrides={"upstream": settings})
    process = ManagedProcess(f"proxy-{provider}", [
        sys.executable, "-m", "proxy.cli", "serve", "--config", str(config)],
        work / f"proxy-{provider}.log", env=_PROXY_ENV)
    process.start()
    try:
        url = f"http://127.0.0.1:{port}"
        await _wait_until_up(client, process, f"{url}/healthz")
        yield Service(url, process)
    finally:
        process.stop()


async def _send(client: aiohttp.ClientSession, url: str, request: tuple[str, bytes,
                                                                         dict[str, str]]) -> None:
    path, body, headers = request
    async with client.post(URL(url + path, encoded=True), data=body, headers={
            **headers, "content-type": "application/json",
            "x-compact-session-id": "bench-providers"}) as response:
        await response.read()
        if response.status != 200:
            raise RuntimeError(f"{url}{path}: HTTP {response.status}")


async def measure(size: int, requests: int, pace_s: float, *,
                  stream: bool = False) -> ProviderCosts:
    """Start the fakes and the proxies; the same conversation to each proxy in turn."""
    body = request_body(history_of_size(size), stream=stream)
    with tempfile.TemporaryDirectory(prefix="compact-proxy-providers-") as tmp:
        work = Path(tmp)
        async with client_session() as client, AsyncExitStack() as stack:
            proxies: dict[str, Service] = {}
            for provider in PROVIDERS:
                fake = await stack.enter_async_context(_fake(client, work, provider))
                proxies[provider] = await stack.enter_async_context(
                    _proxy(client, work, provider, fake.url))
            sent = {p: provider_request(p, body, stream) for p in PROVIDERS}
            for provider, service in proxies.items():
                for _ in range(WARMUP):
                    await _send(client, service.url, sent[provider])
            await asyncio.sleep(SETTLE_S)
            before = {p: process_cpu_s(s.process.pid) for p, s in proxies.items()
                      if s.process is not None}
            for _ in range(requests):
                for provider, service in proxies.items():
                    await _send(client, service.url, sent[provider])
                    if pace_s:
                        await asyncio.sleep(pace_s)
            await asyncio.sleep(SETTLE_S)
            cpu = {p: (process_cpu_s(s.process.pid) - before[p]) * 1000 / requests
                   for p, s in proxies.items() if s.process is not None}
    return ProviderCosts(len(body), requests, stream, cpu)


def format_costs(costs: ProviderCosts) -> str:
    """One row per provider: CPU per request and its ratio to first-party."""
    lines = [f"proxy CPU per request, {costs.body_bytes // 1000} KB conversation, "
             f"{costs.requests} requests each, {'streamed' if costs.stream else 'JSON'}",
             f"{'provider':<12}{'CPU ms/request':>16}{'vs first-party':>16}"]
    for provider in PROVIDERS:
        lines.append(f"{provider:<12}{costs.cpu_ms[provider]:>16.3f}"
                     f"{costs.ratio(provider):>15.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--size", type=int, default=50_000)
    parser.add_argument("--pace-ms", type=float, default=10.0)
    parser.add_argument("--stream", action="store_true")
    args = parser.parse_args(argv)
    started = time.monotonic()
    costs = asyncio.run(measure(args.size, args.requests, args.pace_ms / 1000,
                                stream=args.stream))
    print(format_costs(costs))
    print(f"({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
