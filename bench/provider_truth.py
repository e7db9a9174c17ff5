"""What the provider's own answers teach the proxy, measured: calibration, recovery, and cost.

Two parts, each a long agent session (``bench.harness.workloads.AgentSession``: Claude-Code-like
requests with a cached system prompt and tools and a breakpoint moved to the newest message
every turn) sent with a raw aiohttp client, in one process: the strict fake provider
(:mod:`proxy.fake_upstream`) and the real proxy app on loopback.

1. **Calibration** (``--calibration-turns``, default 200): the provider counts 1.3 × characters
   / 4 with a per-block noise (``--noise``: ±10 % and ±2 %) and has a 120 000-token window;
   the proxy's hard limit is that window. For each token counter, with calibration on and
   off, for a first session (a fresh process) and a second one after it: the calibrated
   estimate's error
   against the provider's count of every forwarded view (after the first answer), the
   ``prompt is too long`` refusals the provider made (each retried once by the proxy) and the
   ones the client saw.
2. **Cost** (``--cost-turns``, default 300): the same session sent directly to the provider (no
   proxy: its window raised so that every request is answered and billed, and the requests the
   real 200 000 window would have refused are counted), and through the proxy with
   ``summary.mode: fork`` and ``separate``
   (thresholds of bench/proxy.py's session part: a crossing needs L4). Billed tokens by kind,
   summary calls and their tokens by kind (each call priced at its own model), the cost at
   the default price table,
   and the net saving against no proxy — measured, and as ``compact-proxy report`` estimates
   it from the ledger.

    python bench/provider_truth.py [--calibration-turns 200] [--cost-turns 300]

Figures are counts, not timings: the run is deterministic and does not need an idle machine.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.harness.config import MODEL
from bench.harness.workloads import AgentSession, request_body
from proxy.accounting.report import build_report
from proxy.accounting.usage import ProviderUsage, UsageEntry, usage_cost
from proxy.config import Config, LoggingConfig
from proxy.fake_upstream import FakeUpstream, start_fake_upstream
from proxy.server.app import start_proxy
from proxy.store import SQLiteStateStore
from proxy.telemetry.logs import configure_logging

API_KEY = "sk-ant-bench-provider-truth"
WINDOW = 120_000
REAL_WINDOW = 200_000
#: bench/proxy.py's session thresholds: L3 keeps 60 messages, more than fit below the sticky
#: target, so every crossing needs L4 (and its summary call).
COST_THRESHOLDS = {"soft_threshold_tokens": 40_000, "hard_limit_tokens": 100_000,
                   "max_tool_result_tokens": 2_000, "keep_recent_messages": 60,
                   "summary_keep_recent": 8}
#: The default configuration: its price table prices every run.
DEFAULTS = Config.from_mapping({}, require_upstream=False)


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@asynccontextmanager
async def _provider(**options: Any) -> AsyncIterator[tuple[FakeUpstream, str]]:
    upstream = FakeUpstream(**options)
    runner, url = await start_fake_upstream(upstream)
    try:
        yield upstream, url
    finally:
        await runner.cleanup()


@asynccontextmanager
async def _proxy(upstream_url: str, workdir: Path, overrides: dict[str, Any]
                 ) -> AsyncIterator[tuple[str, Path]]:
    store = workdir / "state.db"
    mapping: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": 0},
        "upstream": {"base_url": upstream_url},
        "store": {"path": str(store)},
        "sources": {"transcript_root": str(workdir / "t"), "artifact_root": str(workdir / "a")},
        "logging": {"format": "json", "level": "warning"},
    }
    for section, values in overrides.items():
        mapping.setdefault(section, {}).update(values)
    runner, url = await start_proxy(Config.from_mapping(mapping))
    try:
        yield url, store
    finally:
        await runner.cleanup()


@dataclass
class Answer:
    status: int
    usage: ProviderUsage | None
    estimate: int | None
    refusal: str | None


async def _post(client: aiohttp.ClientSession, url: str, messages: Sequence[dict[str, Any]],
                session_id: str) -> Answer:
    headers = {"x-api-key": API_KEY, "anthropic-version": "2023-06-01",
               "content-type": "application/json", "x-compact-session-id": session_id}
    async with client.post(f"{url}/v1/messages", data=request_body(messages, stream=False),
                           headers=headers) as response:
        body = await response.json()
        estimate = response.headers.get("x-compact-tokens-after")
    if response.status != 200:
        return Answer(response.status, None, None, body["error"]["message"])
    return Answer(200, ProviderUsage.from_usage(body["usage"]),
                  int(estimate) if estimate is not None else None, None)


async def _metric(client: aiohttp.ClientSession, url: str, name: str) -> float:
    async with client.get(f"{url}/metrics") as response:
        text = await response.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


# -- part 1: calibration --------------------------------------------------------------------


@dataclass
class CalibrationRun:
    counter: str
    calibration: bool
    session: str
    errors: list[float] = field(default_factory=list)
    provider_refusals: int = 0
    client_refusals: int = 0
    compacted: int = 0

    def row(self) -> str:
        after = [abs(e) for e in self.errors[1:]] or [0.0]
        within = sum(1 for e in after if e <= 0.03)
        return (f"{self.counter:>8} {'on' if self.calibration else 'off':>5} {self.session:>7} "
                f"{statistics.median(after) * 100:>8.2f}% {max(after) * 100:>8.2f}% "
                f"{within:>5}/{len(after):<5} {self.provider_refusals:>9} "
                f"{self.client_refusals:>8} {self.compacted:>9}")


async def calibration_runs(client: aiohttp.ClientSession, turns: int, counter: str,
                           calibration: bool, noise: float) -> list[CalibrationRun]:
    """Two sessions, one after the other, through one proxy: the first learns from nothing
    (a fresh process), the second starts from what the first taught the fleet."""
    runs = []
    async with _provider(token_ratio=1.3, token_noise=noise, context_window=WINDOW) as (
            _, upstream_url):
        with tempfile.TemporaryDirectory() as tmp:
            async with _proxy(upstream_url, Path(tmp), {"compaction": {
                    "token_counter": counter, "calibration": calibration,
                    "soft_threshold_tokens": 90_000, "hard_limit_tokens": WINDOW}}) as (url, _):
                for name, seed in (("first", 7), ("second", 11)):
                    run = CalibrationRun(counter, calibration, name)
                    refused = await _metric(client, url,
                                            "compact_proxy_requests_recompacted_total")
                    compacted = await _compactions(client, url)
                    agent = AgentSession(seed)
                    messages = [agent.first_message()]
                    for _turn in range(turns):
                        answer = await _post(client, url, messages, f"cal-{counter}-{name}")
                        if answer.refusal is not None:
                            run.client_refusals += "prompt is too long" in answer.refusal
                        elif answer.usage is not None and answer.estimate is not None:
                            provider = answer.usage.prompt_tokens
                            run.errors.append((answer.estimate - provider) / provider)
                        messages.extend(agent.next_exchange())
                    run.provider_refusals = int(await _metric(
                        client, url, "compact_proxy_requests_recompacted_total") - refused)
                    run.compacted = int(await _compactions(client, url) - compacted)
                    runs.append(run)
    return runs


async def _compactions(client: aiohttp.ClientSession, url: str) -> float:
    return (await _metric(client, url, 'compact_proxy_layers_applied_total{layer="L3"}')
            + await _metric(client, url, 'compact_proxy_layers_applied_total{layer="L4"}'))


# -- part 2: cost -----------------------------------------------------------------------------


@dataclass
class CostRun:
    name: str
    client: UsageEntry = field(default_factory=UsageEntry)
    summaries: UsageEntry = field(default_factory=UsageEntry)
    over_real_window: int = 0
    report_saving: float | None = None
    summary_cost: float = 0.0
    summary_models: set[str] = field(default_factory=set)

    def cost(self) -> float:
        """The client's requests and the summary calls (each at its model's price), as billed
        at the default prices."""
        price = DEFAULTS.price_for(MODEL)
        assert price is not None
        return usage_cost(self.client, price).billed + self.summary_cost


def _entry(usage: ProviderUsage) -> UsageEntry:
    return UsageEntry(requests=1, tokens_sent=usage.prompt_tokens, input_tokens=usage.input,
                      cache_read_tokens=usage.cache_read, cache_write_tokens=usage.cache_write,
                      output_tokens=usage.output)


async def cost_run(client: aiohttp.ClientSession, turns: int, mode: str | None) -> CostRun:
    run = CostRun(mode or "no proxy")
    window = 10_000_000 if mode is None else REAL_WINDOW
    async with _provider(context_window=window) as (_, upstream_url):
        with tempfile.TemporaryDirectory() as tmp:
            if mode is None:
                await _drive_cost(client, upstream_url, turns, run)
                return run
            async with _proxy(upstream_url, Path(tmp), {"summary": {"mode": mode},
                                                        "compaction": COST_THRESHOLDS}) as (
                    url, store_path):
                await _drive_cost(client, url, turns, run)
            # The proxy has stopped: it wrote the usage it sums between writes.
            store = SQLiteStateStore(store_path)
            try:
                rows = await store.usage_rows()
            finally:
                await store.close()
    for row in rows:
        if not row.entry.summary_calls:
            continue
        run.summaries += UsageEntry(**{name: getattr(row.entry, name)
                                       for name in UsageEntry.field_names()
                                       if name.startswith("summary_")})
        price = DEFAULTS.price_for(row.model)
        assert price is not None, row.model
        run.summary_cost += usage_cost(row.entry, price).summary
        run.summary_models.add(row.model)
    report = build_report(rows, DEFAULTS.price_for)
    run.report_saving = report.total.cost.net_saving if report.total.cost else None
    return run


async def _drive_cost(client: aiohttp.ClientSession, url: str, turns: int, run: CostRun) -> None:
    agent = AgentSession()
    messages = [agent.first_message()]
    for turn in range(turns):
        answer = await _post(client, url, messages, f"cost-{run.name}")
        if answer.usage is None:
            raise RuntimeError(f"{run.name}: turn {turn} refused: {answer.refusal}")
        run.client += _entry(answer.usage)
        run.over_real_window += answer.usage.prompt_tokens > REAL_WINDOW
        messages.extend(agent.next_exchange())


def _cost_table(runs: Sequence[CostRun]) -> list[str]:
    base = runs[0].cost()
    lines = [f"{'':>28} {'input':>10} {'cache wr':>10} {'cache rd':>11} {'output':>8} "
             f"{'summ.':>5} {'summ. in/wr/rd/out':>30} {'cost $':>7} {'saving':>16} "
             f"{'report est.':>11} {'>200k':>6}"]
    for run in runs:
        c, s = run.client, run.summaries
        summary_tokens = (f"{s.summary_input_tokens:,}/{s.summary_cache_write_tokens:,}/"
                          f"{s.summary_cache_read_tokens:,}/{s.summary_output_tokens:,}")
        saving = base - run.cost()
        estimate = "" if run.report_saving is None else f"${run.report_saving:.2f}"
        name = run.name if not run.summary_models else (
            f"{run.name} ({', '.join(sorted(run.summary_models))})")
        lines.append(
            f"{name:>28} {c.input_tokens:>10,} {c.cache_write_tokens:>10,} "
            f"{c.cache_read_tokens:>11,} {c.output_tokens:>8,} {s.summary_calls:>5} "
            f"{summary_tokens:>30} {run.cost():>7.2f} "
            f"{saving:>8.2f} ({saving / base * 100:>4.1f}%) {estimate:>11} "
            f"{run.over_real_window:>6}")
    return lines


async def main(calibration_turns: int, cost_turns: int, noises: Sequence[float]) -> None:
    configure_logging(LoggingConfig(format="json", level="warning"), stream=sys.stderr)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as client:
        for noise in noises:
            print(f"# 1. Calibration: {calibration_turns} turns, provider = 1.3 x chars/4 "
                  f"+-{noise * 100:g} % per block, window {WINDOW:,} = the proxy's hard limit")
            print(f"{'counter':>8} {'calib':>5} {'session':>7} {'p50 |err|':>9} "
                  f"{'max |err|':>9} {'<=3%':>11} {'refusals':>9} {'client':>8} {'L3/L4':>9}")
            for counter in ("tiktoken", "chars4"):
                for calibration in (True, False):
                    _progress(f"calibration: {counter}, calibration {calibration}, "
                              f"noise {noise}")
                    for run in await calibration_runs(client, calibration_turns, counter,
                                                      calibration, noise):
                        print(run.row(), flush=True)
            print()
        print(f"# 2. Cost: {cost_turns} turns at the default prices for {MODEL} "
              "(input / cache write / cache read / output tokens billed; summary calls)")
        runs = []
        for mode in (None, "fork", "separate"):
            _progress(f"cost: {mode or 'no proxy'}")
            runs.append(await cost_run(client, cost_turns, mode))
        print("\n".join(_cost_table(runs)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calibration-turns", type=int, default=200)
    parser.add_argument("--cost-turns", type=int, default=300)
    parser.add_argument("--noise", type=float, action="append",
                        help="the provider's per-block noise (repeatable; default 0.1 and 0.02)")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.calibration_turns, arguments.cost_turns,
                     arguments.noise or (0.1, 0.02)))
