"""Zero-wait compaction: the summary the next crossing needs, made before it comes
(``summary.prepare_at``; docs/how-it-works.md, "Zero-wait compaction").

What a preparation covers is a record of the session's lane (``prepared:<lane>``) that every
replica reads and the compactor uses at the crossing (``CompactionOptions.prepared``); its text
lands in the summary cache. Decisions and records are made before the triggering request is
forwarded, from the session's requests only (never from when a call ended), so every replica
forwards the same views.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, Literal, cast

import msgspec
import structlog

import compactor
from policies import CompactionPolicy
from proxy.accounting.entries import Accounting
from proxy.accounting.ledger_buffer import BufferedLedger
from proxy.accounting.usage import PREPARED_ROW, PREPARED_USED_ROW, ProviderUsage
from proxy.store import RecordStore, StoreError
from proxy.telemetry.metrics import ProxyMetrics

__all__ = ["PREPARED_RECORD_PREFIX", "PREPARED_ROW", "PreparedRecord", "Preparations",
           "served_by"]

_log = structlog.get_logger("proxy.summary.prepare")

#: Record kind in the store: ``prepared:<lane>``.
PREPARED_RECORD_PREFIX: Final = "prepared:"
#: Record kind of what the lane's latest preparation was billed: ``prepared-billed:<lane>``.
BILLED_RECORD_PREFIX: Final = "prepared-billed:"
#: Growth (share of the soft threshold) after which a ``cheap`` lane is checked again.
_RECHECK_SHARE: Final = 0.05

State = Literal["running", "used", "cheap"]


class PreparedRecord(msgspec.Struct, frozen=True):
    """A summary made ahead for one session lane: the first ``cut`` messages of the view
    (``prefix`` their fingerprint), its summary cache key (without the tenant), and its state:
    ``running`` (asked for), ``used`` (it served a crossing) or ``cheap`` (the cheap layers
    reach the target: checked again once the view grows past ``checked``)."""

    cut: int
    prefix: int
    cache_key: str
    state: State
    started: float
    checked: int = 0

    @property
    def usable(self) -> bool:
        """Whether a crossing may use it (the crossing reads its text from the cache, or
        joins its call while it runs)."""
        return self.state == "running"

    @property
    def span(self) -> compactor.PreparedSpan:
        """What the compactor needs of it."""
        return compactor.PreparedSpan(self.cut, self.prefix, self.cache_key)


class _Billed(msgspec.Struct, frozen=True):
    """What the calls of the preparation of ``cache_key`` were billed, and by which model."""

    cache_key: str
    model: str = ""
    usage: ProviderUsage = ProviderUsage()

    @property
    def tokens(self) -> int:
        """All its tokens: input, cache and output."""
        return self.usage.prompt_tokens + self.usage.output


def served_by(outcomes: Sequence[compactor.LayerOutcome]) -> str | None:
    """How a crossing's summary was served: ``prepared``, ``inline`` (made while the request
    waited, or read from the cache), ``none`` (no summary in the view); None: no crossing."""
    if not outcomes:
        return None
    for outcome in outcomes:
        if outcome.layer == "L4" and outcome.applied:
            return "prepared" if outcome.detail == compactor.PREPARED_DETAIL else "inline"
    return "none"


_ENCODER: Final = msgspec.json.Encoder()
_DECODER: Final = msgspec.json.Decoder(PreparedRecord)
_BILLED_DECODER: Final = msgspec.json.Decoder(_Billed)


class Preparations:
    """The preparations of every session lane, in the store (every replica reads them).

    ``summary_tokens`` is what a summary is taken to weigh (``summary.max_tokens``); a
    ``running`` record whose call has not ended after ``lifetime_s`` is taken to have died
    with its process, and its span is asked for again.
    """

    def __init__(self, store: RecordStore, metrics: ProxyMetrics, summary_tokens: int,
                 ledger: BufferedLedger | None = None, *, prepare_at: float = 0.8,
                 lifetime_s: float = float("inf")) -> None:
        self._store = store
        self._metrics = metrics
        self._summary_tokens = summary_tokens
        self._ledger = ledger
        self.prepare_at = prepare_at
        self._lifetime_s = lifetime_s

    async def load(self, session: str, lane: str) -> PreparedRecord | None:
        """The lane's record, or None (none, or unreadable)."""
        try:
            data = await self._store.get_record(session, PREPARED_RECORD_PREFIX + lane)
            return _DECODER.decode(data) if data else None
        except (StoreError, msgspec.DecodeError) as exc:
            _log.warning("prepared_summary_unreadable", error_class=type(exc).__name__)
            return None

    async def _save(self, session: str, lane: str, record: PreparedRecord | _Billed, *,
                    prefix: str = PREPARED_RECORD_PREFIX) -> bool:
        try:
            await self._store.put_record(session, prefix + lane, _ENCODER.encode(record))
        except StoreError as exc:
            _log.warning("prepared_summary_not_saved", error_class=type(exc).__name__)
            return False
        return True

    async def _billed(self, session: str, lane: str, record: PreparedRecord) -> _Billed | None:
        """What ``record``'s summary was billed, once its call has ended (:meth:`finish`)."""
        try:
            data = await self._store.get_record(session, BILLED_RECORD_PREFIX + lane)
            billed = _BILLED_DECODER.decode(data) if data else None
        except (StoreError, msgspec.DecodeError):
            return None
        return billed if billed is not None and billed.cache_key == record.cache_key else None

    async def used(self, session: str, lane: str, record: PreparedRecord) -> None:
        """A crossing was served by ``record``: it is spent, its tokens counted used (in the
        metrics, and in the ledger's ``<session>#prepared-used`` row the report reads)."""
        await self._save(session, lane, msgspec.structs.replace(record, state="used"))
        billed = await self._billed(session, lane, record) or _Billed(record.cache_key)
        self._metrics.count_prepared("used", billed.tokens)
        if billed.model and self._ledger is not None:
            self._ledger.add(session + PREPARED_USED_ROW, billed.model,
                             Accounting.summary_entry(billed.usage))

    async def consider(self, session: str, lane: str, record: PreparedRecord | None,
                       policy: CompactionPolicy, result: compactor.CompactionResult, *,
                       scale: float, reserved: int, counter: compactor.CachingCounter,
                       plan_span: Callable[[Callable[[], object]], Awaitable[object]],
                       ) -> tuple[compactor.SummaryRequest, PreparedRecord] | None:
        """Whether the lane's forwarded view ``result`` needs a preparation (``record``: the
        lane's, as read): if so, the summary to ask for and its record, saved as ``running``
        so every later request sees it. ``plan_span`` runs the planning where the request's
        work runs."""
        soft = policy.soft_threshold_tokens
        target = max(1, int(soft * policy.compact_to_ratio))
        if record is not None:
            if record.state == "cheap" and record.checked <= result.tokens_after < \
                    record.checked + soft * _RECHECK_SHARE:
                return None  # (a smaller view was compacted since: checked again)
            if self._fresh(record, result, scale, target):
                if time.time() - record.started < self._lifetime_s or \
                        await self._billed(session, lane, record) is not None:
                    return None
                return await self._restart(session, lane, record, result, scale=scale,
                                           reserved=reserved, counter=counter,
                                           plan_span=plan_span)
        found = cast("tuple[compactor.SummaryRequest, compactor.PreparedSpan] | None",
                     await plan_span(lambda: compactor.prepare_span(
            result.messages, policy, counter, fingerprints=result.fingerprints,
            tokens=result.message_tokens, reserved=reserved, scale=scale, stop_below=target)))
        if found is None:  # the cheap layers will do: remembered where every replica reads
            await self._save(session, lane, PreparedRecord(
                0, 0, "", "cheap", time.time(), checked=result.tokens_after))
            return None
        request, span = found
        if record is not None and record.cache_key == span.cache_key:
            return None
        if record is not None and record.usable:
            billed = await self._billed(session, lane, record) or _Billed(record.cache_key)
            self._metrics.count_prepared("unused", billed.tokens)
            _log.info("prepared_summary_replaced", prepared_tokens=billed.tokens)
        started = PreparedRecord(span.cut, span.prefix, span.cache_key, "running", time.time())
        if not await self._save(session, lane, started):
            return None
        self._metrics.count_prepared("started", 0)
        _log.info("summary_prepare_started", prepared_messages=request.message_count)
        return request, started

    async def _restart(self, session: str, lane: str, record: PreparedRecord,
                       result: compactor.CompactionResult, *, scale: float, reserved: int,
                       counter: compactor.CachingCounter,
                       plan_span: Callable[[Callable[[], object]], Awaitable[object]],
                       ) -> tuple[compactor.SummaryRequest, PreparedRecord] | None:
        """``record``'s span asked for again (its call outlived its lease without ending):
        the same span and record, so the views forwarded are the same either way; a new
        lease."""
        request = cast("compactor.SummaryRequest | None", await plan_span(
            lambda: compactor.prepared_request(
                result.messages, record.span, counter, fingerprints=result.fingerprints,
                tokens=result.message_tokens, reserved=reserved, scale=scale)))
        if request is None:
            return None
        restarted = msgspec.structs.replace(record, started=time.time())
        if not await self._save(session, lane, restarted):
            return None
        self._metrics.count_prepared("restarted", 0)
        _log.warning("summary_prepare_restarted", prepared_messages=request.message_count,
                     lease_s=round(time.time() - record.started, 1))
        return request, restarted

    async def finish(self, session: str, lane: str, started: PreparedRecord,
                     text: str | None, model: str, usage: ProviderUsage) -> None:
        """The summary of ``started`` came back (``text`` None: it failed): what it cost is
        kept beside its record (never the record itself, which decides what later requests
        do and is written on their path only)."""
        billed = _Billed(started.cache_key, model, usage)
        if text is None:
            _log.warning("summary_prepare_failed", prepared_tokens=billed.tokens)
        else:
            _log.info("summary_prepared", prepared_tokens=billed.tokens)
        await self._save(session, lane, billed, prefix=BILLED_RECORD_PREFIX)

    def _fresh(self, record: PreparedRecord, result: compactor.CompactionResult,
               scale: float, target: int) -> bool:
        """Whether a running preparation still fits the view: the same history
        before its cut, and a crossing now would land below the target with it (the summary
        taken at its largest)."""
        if not record.usable:
            return False
        prints = result.fingerprints
        if len(prints) <= record.cut or \
                compactor.prefix_print(prints[:record.cut]) != record.prefix:
            return False
        covered = round(sum(result.message_tokens[1:record.cut]) * scale)
        return result.tokens_after - covered + self._summary_tokens < target
