"""The request path's side of zero-wait compaction (:mod:`proxy.summary.prepare`): read the
lane's preparation before compacting, time the summarizer (``summary_served``,
``summary_wait_ms``), and start the next preparation once the view reaches
``summary.prepare_at`` of the soft threshold.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING

from msgspec.structs import astuple

import compactor
from policies import CompactionPolicy
from proxy.accounting.usage import ProviderUsage
from proxy.http.audit import RequestRecord
from proxy.http.compute import run_on
from proxy.http.durable import SessionRef
from proxy.summary.prepare import Preparations, PreparedRecord, served_by
from proxy.summary.summarizer import Summarizer

if TYPE_CHECKING:
    from proxy.http.services import Services

__all__ = ["TimedSummarizer", "observe_crossing", "prepare_next", "prepared_record"]

#: Makes the request's summarizer for a preparation, told each call's model and ``usage``.
SourceFactory = Callable[[Callable[[str, ProviderUsage], None]], Summarizer]


def _preparations(s: Services, policy: CompactionPolicy) -> Preparations | None:
    return s.preparations if policy.summary_enabled else None


async def prepared_record(s: Services, session: SessionRef, lane: str,
                          policy: CompactionPolicy, estimate: int | None,
                          ) -> PreparedRecord | None:
    """The lane's preparation record, read only for a history (``estimate``: its calibrated
    size, None: unknown) that has reached ``summary.prepare_at``."""
    preparations = _preparations(s, policy)
    if preparations is None:
        return None
    if estimate is not None and estimate < preparations.prepare_at * policy.soft_threshold_tokens:
        return None
    return await preparations.load(session.key, lane)


class TimedSummarizer:
    """A request's summarizer, timed: how long the request waited for summaries."""

    def __init__(self, inner: Summarizer | None) -> None:
        self.inner = inner
        self.waited_s = 0.0

    async def __call__(self, request: compactor.SummaryRequest) -> str | None:
        assert self.inner is not None
        started = time.perf_counter()
        try:
            return await self.inner(request)
        finally:
            self.waited_s += time.perf_counter() - started


async def observe_crossing(s: Services, record: RequestRecord, session: SessionRef,
                           lane: str, result: compactor.CompactionResult,
                           prepared: PreparedRecord | None, waited_s: float, *,
                           forwarded: bool) -> None:
    """Log and count how a crossing's summary was served and what it waited; a preparation
    a forwarded view used is marked spent before the view is forwarded."""
    served = served_by(result.outcomes)
    if served is None:
        return
    record.summary_served = served
    record.summary_wait_ms = round(waited_s * 1000, 1)
    if not forwarded:
        return
    s.metrics.observe_crossing(served, waited_s)
    if served == "prepared" and prepared is not None and s.preparations is not None:
        await s.preparations.used(session.key, lane, prepared)


async def prepare_next(s: Services, session: SessionRef, lane: str,
                       prepared: PreparedRecord | None, policy: CompactionPolicy,
                       result: compactor.CompactionResult, *, scale: float, reserved: int,
                       executor: Executor | None, source: SourceFactory) -> None:
    """When the forwarded view reached ``summary.prepare_at`` without crossing and needs a
    preparation, record it and start its summary call in the background."""
    preparations = _preparations(s, policy)
    if preparations is None or result.outcomes:
        return
    if result.tokens_after < preparations.prepare_at * policy.soft_threshold_tokens:
        return
    if prepared is None:  # (not read before compacting: the history's estimate was smaller)
        prepared = await preparations.load(session.key, lane)

    found = await preparations.consider(session.key, lane, prepared, policy, result,
                                        scale=scale, reserved=reserved, counter=s.counter,
                                        plan_span=functools.partial(run_on, executor))
    if found is None:
        return
    request, started = found

    async def summarize() -> None:
        calls: list[tuple[str, ProviderUsage]] = []  # (model, usage) of each call
        text = await source(lambda model, usage: calls.append((model, usage)))(request)
        total = ProviderUsage(*map(sum, zip(*(astuple(u) for _, u in calls), strict=True)))
        await preparations.finish(session.key, lane, started, text,
                                  calls[0][0] if calls else "", total)

    s.background.run(summarize, failure_event="summary_prepare_failed")
