"""A fake provider in its own process, for tests that load the proxy (``python -m
tests.reliability.upstream_process --event-delay 0.02``): the default script, with every SSE
event of an answer sent ``--event-delay`` seconds apart. Prints
``fake upstream listening on <url>`` once it serves; stops on SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
from typing import Any

from proxy.fake_upstream import FakeUpstream, RecordedRequest, Reply, default_script
from proxy.fake_upstream.server import start_fake_upstream


def paced_script(delay_s: float) -> Any:
    """The default script with ``event_delay_s`` set on every reply."""

    def script(body: dict[str, Any], meta: RecordedRequest) -> Reply:
        return dataclasses.replace(default_script(body, meta), event_delay_s=delay_s)

    return script


async def serve(delay_s: float) -> None:
    """Serve until SIGTERM/SIGINT; keep no request records (the process runs under load)."""
    upstream = FakeUpstream(paced_script(delay_s))
    runner, url = await start_fake_upstream(upstream)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)

    async def forget() -> None:
        while True:
            await asyncio.sleep(1.0)
            upstream.requests.clear()

    forgetting = asyncio.create_task(forget())
    print(f"fake upstream listening on {url}", flush=True)
    try:
        await stop.wait()
    finally:
        forgetting.cancel()
        await runner.cleanup()


def main() -> None:
    """Parse ``--event-delay`` and serve."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--event-delay", type=float, default=0.0)
    asyncio.run(serve(parser.parse_args().event_delay))


if __name__ == "__main__":
    main()
