"""CPU of one L4 summary call: the proxy's call against the SDK's ``messages.create``.

    python -m bench.summary_call [--calls 20] [--sizes 100000,250000,500000]
                                 [--corpus FILE]

A summary call in ``fork`` mode (the default) sends the client's conversation up to the kept
turns: hundreds of kilobytes. The proxy makes it with the anthropic SDK; ``messages.create``
copies every message and block of the body in Python and encodes the copy with ``json``
before sending it. The proxy now hands the SDK's client the body encoded by msgspec
(``client.post(content=...)``: the same client, credentials, timeout, retries and answer).
For conversations of the corpus cut at ``--sizes`` bytes, this prints the CPU of this process
per call, each way, against the stamped fake provider in a child process (the provider's own
CPU is not counted): ``ProviderSummarizer.summarize`` as the proxy calls it, and the same
call made with ``messages.create``, the way before. Not a timed test;
``tests/bench/test_summary_call_smoke.py`` runs it at a tiny size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import anthropic

import compactor
from bench.harness.client import client_session
from bench.harness.config import BENCH_API_KEY
from bench.harness.processes import upstream_process
from proxy.config import SummaryConfig
from proxy.summary.calls import ForkSource, SummaryCall, fork_call
from proxy.summary.summarizer import CallerCredentials, ProviderSummarizer

#: A real Claude Code conversation (the corpus's largest, 590 KB), cut at each size.
CORPUS: Final = (Path(__file__).resolve().parents[2] / "shared" / "corpus" / "real"
                 / "cctrace__phase0-investigation__132b2f66-ee5f-46f6-8904-32d9dc4d36c3.json")
MODEL: Final = "claude-sonnet-4-5"


@dataclass(frozen=True)
class CallCost:
    """CPU milliseconds per summary call of one conversation, each way."""

    conversation_bytes: int
    messages: int
    proxy_ms: float
    sdk_create_ms: float


def fork_of(corpus: Path, size: int) -> tuple[ForkSource, list[dict[str, Any]], SummaryCall]:
    """The corpus request as a fork source, its first messages from about ``size`` bytes on
    to the first place a user turn may follow, and the fork call of them."""
    request = json.loads(corpus.read_text(encoding="utf-8"))
    source = ForkSource(headers=(("x-api-key", BENCH_API_KEY),), model=MODEL,
                        system=request.get("system"), tools=request.get("tools"))
    kept: list[dict[str, Any]] = []
    total = 0
    for message in request["messages"]:
        total += len(json.dumps(message))
        kept.append(message)
        call = fork_call(source, kept) if total >= size else None
        if call is not None:
            return source, kept, call
    raise ValueError(f"{corpus.name} has no fork of {size} bytes or more")


async def _cpu_ms(call: Callable[[], Awaitable[object]], calls: int) -> float:
    for _ in range(2):
        await call()
    started = time.process_time()
    for _ in range(calls):
        await call()
    return (time.process_time() - started) * 1000 / calls


async def _cost(provider: ProviderSummarizer, sdk: anthropic.AsyncAnthropic, corpus: Path,
                size: int, calls: int) -> CallCost:
    source, conversation, call = fork_of(corpus, size)
    request = compactor.SummaryRequest("[]", "key", len(conversation), tuple(conversation))

    async def proxy_call() -> None:
        result = await provider.summarize(request, CallerCredentials.from_headers({}),
                                          fork=source)
        assert result.text, result

    async def sdk_create() -> None:  # (how the proxy called the SDK before)
        message = await sdk.messages.create(
            model=MODEL, max_tokens=provider.config.max_tokens,
            messages=list(call.messages),  # type: ignore[arg-type]
            system=anthropic.omit if call.system is None else call.system,
            tools=anthropic.omit if call.tools is None else call.tools)
        assert message.content

    return CallCost(len(json.dumps(call.messages)), len(call.messages),
                    await _cpu_ms(proxy_call, calls), await _cpu_ms(sdk_create, calls))


async def measure(sizes: Sequence[int], calls: int, corpus: Path = CORPUS) -> list[CallCost]:
    """Each size's :class:`CallCost` (see the module)."""
    with tempfile.TemporaryDirectory(prefix="compact-proxy-summary-call-") as tmp:
        async with client_session() as http, upstream_process(http, Path(tmp)) as upstream:
            provider = ProviderSummarizer(SummaryConfig(max_retries=0), upstream.url, None)
            sdk = anthropic.AsyncAnthropic(api_key=BENCH_API_KEY, base_url=upstream.url,
                                           max_retries=0)
            try:
                return [await _cost(provider, sdk, corpus, size, calls) for size in sizes]
            finally:
                await provider.close()
                await sdk.close()


def format_costs(costs: Sequence[CallCost]) -> str:
    """The table, one row per conversation."""
    lines = ["CPU per L4 summary call (fork mode), this process only, ms",
             f"   {'conversation':>14}{'messages':>10}{'proxy':>9}{'messages.create':>17}"
             f"{'ratio':>8}"]
    for cost in costs:
        lines.append(f"   {cost.conversation_bytes / 1000:>11.0f} KB{cost.messages:>10}"
                     f"{cost.proxy_ms:>9.2f}{cost.sdk_create_ms:>17.2f}"
                     f"{cost.proxy_ms / cost.sdk_create_ms:>8.2f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run and print."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--sizes", default="100000,250000,500000",
                        help="conversation sizes in bytes, comma-separated")
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.sizes.split(",")]
    print(format_costs(asyncio.run(measure(sizes, args.calls, args.corpus))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
