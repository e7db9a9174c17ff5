"""Callers that hold connections (issue #31): what the next caller and ``/healthz`` see.

    python -m bench.hostile_conns [--streams 1000] [--slow 1100] [--nofile 1024]
                                  [--hold-s 40] [--source PATH] [--json PATH]

Two phases, each against its own ``compact-proxy serve`` process (defaults of every key, so
that an older tree given by ``--source`` runs the same config):

1. **Pool.** The provider is a socket server that accepts and reads but never answers.
   ``--streams`` streamed requests (from four tenants, ``session.scope: header:x-tenant``) are
   sent and held; then one more request, of a fifth tenant, is timed: its status and seconds
   (``upstream.read_timeout_s`` is 30 s here, to bound the old wait).
2. **Slowloris.** The proxy starts with a soft limit of ``--nofile`` open files
   (``ulimit -Sn``, the usual 1024 of a login shell; the hard limit is left as it is).
   ``--slow`` connections send a request's headers a byte a second for ``--hold-s``
   seconds; ``/healthz`` is probed every second meanwhile: its status (``err`` when it could
   not be reached) and time, and how many slow connections the proxy closed or refused.

Loopback only; ends its processes on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from bench.harness.config import ROOT
from bench.harness.processes import ManagedProcess, free_port, wait_until_up

#: ``upstream.read_timeout_s`` of the proxies (bounds the old wait).
READ_TIMEOUT_S = 30
TENANTS = 4


def _config(workdir: Path, upstream_url: str, read_timeout_s: float) -> tuple[Path, str]:
    port = free_port()
    config = {"listen": {"host": "127.0.0.1", "port": port},
              "upstream": {"base_url": upstream_url, "read_timeout_s": read_timeout_s},
              "store": {"path": str(workdir / "state.db")},
              "sources": {"transcript_root": str(workdir / "t"),
                          "artifact_root": str(workdir / "a")},
              "compaction": {"token_counter": "chars4"},
              "session": {"scope": "header:x-tenant"},
              "logging": {"level": "warning"}}
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path, f"http://127.0.0.1:{port}"


async def _start(workdir: Path, name: str, source: Path, upstream_url: str,
                 nofile: int | None = None,
                 read_timeout_s: float = READ_TIMEOUT_S) -> tuple[ManagedProcess, str]:
    workdir.mkdir(parents=True)
    path, url = _config(workdir, upstream_url, read_timeout_s)
    argv = [sys.executable, "-m", "proxy.cli", "serve", "--config", str(path)]
    if nofile is not None:
        argv = ["sh", "-c", f'ulimit -Sn {nofile} && exec "$@"', "sh", *argv]
    process = ManagedProcess(name, argv, workdir / f"{name}.log", source=source)
    process.start()
    async with aiohttp.ClientSession() as client:
        await wait_until_up(client, process, f"{url}/healthz")
    return process, url


def _body(text: str) -> bytes:
    return json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 16, "stream": True,
                       "messages": [{"role": "user", "content": text}]}).encode()


HEADERS = {"x-api-key": "sk-ant-bench", "content-type": "application/json",
           "anthropic-version": "2023-06-01"}


async def pool_phase(workdir: Path, source: Path, streams: int,
                     read_timeout_s: float = READ_TIMEOUT_S) -> dict[str, Any]:
    """Hold ``streams`` streams on a silent provider; time the next caller."""
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        while await reader.read(65536):
            pass

    server = await asyncio.start_server(silent, "127.0.0.1", 0, backlog=4096)
    upstream = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    process, url = await _start(workdir / "pool", "proxy-pool", source, upstream,
                                read_timeout_s=read_timeout_s)
    connector = aiohttp.TCPConnector(limit=0)
    try:
        async with aiohttp.ClientSession(connector=connector) as http:
            async def one(i: int) -> None:
                async with http.post(f"{url}/v1/messages", data=_body(f"hold {i}"),
                                     headers={**HEADERS, "x-tenant": str(i % TENANTS)}) as resp:
                    await resp.read()

            holders = [asyncio.create_task(one(i)) for i in range(streams)]
            seen, still = 0, time.monotonic()
            while len(held) < streams and time.monotonic() - still < 3:
                await asyncio.sleep(0.1)
                if len(held) > seen:
                    seen, still = len(held), time.monotonic()
            at_provider = len(held)
            started = time.monotonic()
            async with http.post(f"{url}/v1/messages", data=_body("next caller"),
                                 headers={**HEADERS, "x-tenant": "next"}) as resp:
                payload = await resp.read()
                status = resp.status
            took = time.monotonic() - started
            for task in holders:
                task.cancel()
            await asyncio.gather(*holders, return_exceptions=True)
    finally:
        process.stop()
        server.close()
        for writer in held:
            writer.close()
    error = json.loads(payload).get("error", {}) if payload.startswith(b"{") else {}
    return {"streams_held": at_provider, "next_status": status,
            "next_error": error.get("type"), "next_wait_s": round(took, 2)}


async def slow_phase(workdir: Path, source: Path, slow: int, nofile: int,
                     hold_s: float) -> dict[str, Any]:
    """``slow`` connections dribbling headers for ``hold_s``; /healthz probed each second."""
    upstream = f"http://127.0.0.1:{free_port()}"  # never reached
    process, url = await _start(workdir / "slow", "proxy-slow", source, upstream, nofile)
    host, port = url.removeprefix("http://").split(":")
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    failed_to_open = 0
    probes: list[tuple[float, str, float]] = []
    try:
        for _ in range(slow):
            try:
                conns.append(await asyncio.open_connection(host, int(port)))
                conns[-1][1].write(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-a: ")
            except OSError:
                failed_to_open += 1
        started = time.monotonic()
        async with aiohttp.ClientSession() as http:
            while (now := time.monotonic()) - started < hold_s:
                for _, writer in conns:
                    if not writer.is_closing():
                        writer.write(b"a")
                probe = time.monotonic()
                try:
                    async with http.get(f"{url}/healthz",
                                        timeout=aiohttp.ClientTimeout(total=5)) as resp:
                        state = str(resp.status)
                except (TimeoutError, aiohttp.ClientError):
                    state = "err"
                probes.append((round(now - started, 1), state,
                               round(time.monotonic() - probe, 3)))
                await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - probe)))
        closed = 0
        for reader, _ in conns:
            try:
                await asyncio.wait_for(reader.read(), 0.01)  # the end: closed (or refused)
                closed += 1
            except TimeoutError:
                pass
            except ConnectionError:
                closed += 1
    finally:
        for _, writer in conns:
            writer.close()
        process.stop()
    statuses: dict[str, int] = {}
    for _, state, _ in probes:
        statuses[state] = statuses.get(state, 0) + 1
    return {"slow_connections": slow, "failed_to_open": failed_to_open,
            "closed_by_proxy": closed, "healthz_statuses": statuses,
            "healthz_max_s": max((took for _, _, took in probes), default=None),
            "healthz_timeline": " ".join(f"{at:g}s:{state}" for at, state, _ in probes)}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Both phases; the figures."""
    source = Path(args.source).resolve() if args.source else ROOT
    with tempfile.TemporaryDirectory(prefix="hostile-conns-") as tmp:
        pool = await pool_phase(Path(tmp), source, args.streams, args.read_timeout_s)
        slow = await slow_phase(Path(tmp), source, args.slow, args.nofile, args.hold_s)
    return {"source": str(source), "pool": pool, "slowloris": slow}


def main() -> None:
    """Parse the arguments, run, print (and write ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--slow", type=int, default=1100)
    parser.add_argument("--nofile", type=int, default=1024)
    parser.add_argument("--hold-s", type=float, default=40.0)
    parser.add_argument("--read-timeout-s", type=float, default=READ_TIMEOUT_S)
    parser.add_argument("--source", help="another source tree to run (e.g. an older commit)")
    parser.add_argument("--json")
    args = parser.parse_args()
    try:
        result = asyncio.run(run(args))
    finally:
        ManagedProcess.stop_all()
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
