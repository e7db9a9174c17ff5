"""What sharing the store costs: three replicas on Redis against one replica on SQLite.

One run starts the stamped fake provider, a ``redis-server`` on a free loopback port, one
proxy on its own SQLite file, one proxy on the Redis server and three more on it
(``compact-proxy serve`` processes), then plays the same deterministic
agent session (:class:`bench.harness.workloads.AgentSession`) against each setup, turn by turn
interleaved so all see the same machine: the single replica on SQLite, the single replica on
Redis, and round-robin over the three. Each turn's request latency (client side, start to
last byte, non-streaming) is recorded; the report is p50 / p99 of each and what Redis, then
the fleet, add to the single SQLite replica (the store's round trips; then, round-robin,
each replica reading the checkpoint and calibration another one wrote, and decoding the
messages its own caches have not seen).

Not a timed test: run it by hand.

    python -m bench.replicas --turns 200 --out bench/results/replicas.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import yaml

from bench.harness.client import client_session, send
from bench.harness.config import TINY_THRESHOLDS, write_proxy_config
from bench.harness.processes import ManagedProcess, free_port, upstream_process, wait_until_up
from bench.harness.stats import percentile
from bench.harness.workloads import AgentSession, request_body, request_headers
from tests.redis_server import RedisServer


def _proxy(workdir: Path, name: str, upstream_url: str, store: dict[str, Any]) -> tuple[
        ManagedProcess, str]:
    port = free_port()
    path = write_proxy_config(workdir / name, upstream_url, TINY_THRESHOLDS, sticky=True,
                              port=port, audit=True)
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    config["store"] = store
    config["logging"]["level"] = "warning"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    process = ManagedProcess(name, [sys.executable, "-m", "proxy.cli", "serve", "--config",
                                    str(path)], workdir / f"{name}.log")
    return process, f"http://127.0.0.1:{port}"


async def run(turns: int, workdir: Path) -> dict[str, Any]:
    """Play ``turns`` turns against every setup; the figures."""
    redis = RedisServer()
    redis.start()
    on_redis = {"backend": "redis", "url": redis.url}
    # Each setup: its proxies (a turn goes to the next one, round-robin).
    layout = {"single_sqlite": [{"backend": "sqlite", "path": str(workdir / "single.db")}],
              "single_redis": [on_redis],
              "three_replicas_redis": [on_redis, on_redis, on_redis]}
    processes: list[ManagedProcess] = []
    setups: dict[str, list[str]] = {}
    try:
        async with client_session() as client, upstream_process(client, workdir) as upstream:
            for name, stores in layout.items():
                setups[name] = []
                for index, store in enumerate(stores):
                    process, url = _proxy(workdir, f"{name}-{index}", upstream.url, store)
                    processes.append(process)
                    setups[name].append(url)
                    process.start()
            for process, url in zip(processes, [u for urls in setups.values() for u in urls],
                                    strict=True):
                await wait_until_up(client, process, f"{url}/healthz")
            session = AgentSession()
            messages = [AgentSession.first_message()]
            times: dict[str, list[float]] = {name: [] for name in setups}
            crossings = dict.fromkeys(setups, 0)
            names = list(setups)
            for turn in range(turns):
                assistant, user = session.next_exchange()
                messages += [assistant, user]
                body = request_body(messages, stream=False)
                # A different setup goes first on each turn: none is always the warm one.
                for name in names[turn % len(names):] + names[:turn % len(names)]:
                    urls = setups[name]
                    sample = await send(client, urls[turn % len(urls)], body,
                                        request_headers(f"bench-{name}"), stream=False)
                    if sample.status != 200:
                        raise RuntimeError(f"turn {turn}: {name} answered {sample.status}")
                    times[name].append(sample.ms)
                    crossings[name] += "L4" in sample.headers.get("x-compact-layers", "")
    finally:
        for process in reversed(processes):
            process.stop()
        redis.stop()

    def figures(values: list[float]) -> dict[str, float]:
        return {"p50_ms": round(percentile(values, 50), 2),
                "p99_ms": round(percentile(values, 99), 2)}

    results: dict[str, Any] = {"turns": turns}
    results.update({name: figures(values) for name, values in times.items()})
    base = results["single_sqlite"]
    for name in ("single_redis", "three_replicas_redis"):
        results[f"{name}_added_ms"] = {
            "p50": round(results[name]["p50_ms"] - base["p50_ms"], 2),
            "p99": round(results[name]["p99_ms"] - base["p99_ms"], 2)}
    results["requests_with_l4"] = crossings
    return results


def main() -> None:
    """Parse the arguments, run, print (and write) the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    with TemporaryDirectory(prefix="bench-replicas-") as tmp:
        results = asyncio.run(run(args.turns, Path(tmp)))
    text = json.dumps(results, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
