"""Zero-wait compaction: the summary the next crossing needs, made before it comes.

When a session's view (calibrated, as the provider counts it) reaches ``summary.prepare_at``
of its soft threshold, :meth:`Preparations.consider` starts, after the request was forwarded,
the summary call for the span the next crossing would cut (:func:`compactor.prepare_span`):
through the request's own summarizer (:func:`proxy.state.summarizer.summary_source`), so the
text lands in the store's summary cache under its content key, and one call per span is made
across every worker and replica (the single flight and its lease). What it covers is a
*record* of the session's lane in the store (``prepared:<lane>``: the cut, the prefix's
fingerprint, the cache key, its state), where every replica finds it: :meth:`Preparations.span`
hands it to the compactor at the crossing (:class:`compactor.CompactionOptions.prepared`).

Never stale: a ready preparation whose verbatim tail has grown too large for the view to land
below the target (or whose history changed) is replaced by a new one, in the background; the
replaced one, never used, is counted with its tokens (``unused``). None starts while one is
running (for ``summary.timeout_s``), and none for ``count_tokens``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, Literal

import msgspec
import structlog
from lru import LRU

import compactor
from policies import CompactionPolicy
from proxy.metrics import ProxyMetrics
from proxy.state.store import RecordStore, StoreError

__all__ = ["PREPARED_RECORD_PREFIX", "PreparedRecord", "Preparations", "served_by"]

_log = structlog.get_logger("proxy.state.prepare")

#: Record kind in the store: ``prepared:<lane>``.
PREPARED_RECORD_PREFIX: Final = "prepared:"
#: Sessions whose cheap layers alone reach the target, remembered to spare the check.
_MEMO_ENTRIES: Final = 4096
#: Growth (share of the soft threshold) after which such a session is checked again.
_RECHECK_SHARE: Final = 0.05

State = Literal["running", "ready", "failed", "used"]


class PreparedRecord(msgspec.Struct, frozen=True):
    """A summary made ahead for one session lane.

    Attributes:
        cut: messages of the view, from the first, the span's plan covers.
        prefix: the fingerprint of those messages (:func:`compactor._prepared.prefix_print`).
        cache_key: the span's summary cache key (the compactor's, without the tenant).
        state: ``running``, ``ready``, ``failed`` or ``used`` (served a crossing).
        started: when it was started (Unix seconds).
        tokens: what its calls were billed (input, cache and output tokens), when this
            process made them.
        summary_tokens: the summary's length in counted tokens, once ready.
    """

    cut: int
    prefix: int
    cache_key: str
    state: State
    started: float
    tokens: int = 0
    summary_tokens: int = 0

    @property
    def span(self) -> compactor.PreparedSpan:
        """What the compactor needs of it."""
        return compactor.PreparedSpan(self.cut, self.prefix, self.cache_key)


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


class Preparations:
    """The preparations of every session lane, in the store (every replica reads them).

    Args:
        store: where the records live.
        metrics: counts preparations started, used and unused, with their tokens.
        timeout_s: how long a running preparation holds off another (``summary.timeout_s``).
    """

    def __init__(self, store: RecordStore, metrics: ProxyMetrics, timeout_s: float) -> None:
        self._store = store
        self._metrics = metrics
        self._timeout_s = timeout_s
        # (session, lane) -> view tokens when the cheap layers were found to reach the target.
        self._cheap: LRU[tuple[str, str], int] = LRU(_MEMO_ENTRIES)

    async def load(self, session: str, lane: str) -> PreparedRecord | None:
        """The lane's record, or None (none, unreadable, or from another version)."""
        try:
            data = await self._store.get_record(session, PREPARED_RECORD_PREFIX + lane)
            return _DECODER.decode(data) if data else None
        except (StoreError, msgspec.DecodeError) as exc:
            _log.warning("prepared_summary_unreadable", error_class=type(exc).__name__)
            return None

    async def _save(self, session: str, lane: str, record: PreparedRecord) -> bool:
        try:
            await self._store.put_record(session, PREPARED_RECORD_PREFIX + lane,
                                         _ENCODER.encode(record))
        except StoreError as exc:
            _log.warning("prepared_summary_not_saved", error_class=type(exc).__name__)
            return False
        return True

    def _running(self, record: PreparedRecord) -> bool:
        return record.state == "running" and time.time() - record.started < self._timeout_s

    async def span(self, session: str, lane: str) -> compactor.PreparedSpan | None:
        """The span a crossing of this lane may use: a ready or running preparation."""
        record = await self.load(session, lane)
        if record is None or not (record.state == "ready" or self._running(record)):
            return None
        return record.span

    async def used(self, session: str, lane: str, span: compactor.PreparedSpan) -> None:
        """A crossing was served by ``span``: its record is spent, its tokens counted used."""
        record = await self.load(session, lane)
        if record is None or record.cache_key != span.cache_key:
            return
        self._metrics.count_prepared("used", record.tokens)
        await self._save(session, lane, msgspec.structs.replace(record, state="used"))

    async def consider(self, session: str, lane: str, policy: CompactionPolicy,
                       result: compactor.CompactionResult, *, scale: float, reserved: int,
                       counter: compactor.CachingCounter,
                       plan_span: Callable[[Callable[[], object]], Awaitable[object]],
                       summarize: Callable[[compactor.SummaryRequest],
                                           Awaitable[tuple[str | None, int]]]) -> None:
        """Start a preparation for the lane's view ``result`` when it needs one, and wait
        for it (run in the background, after the request was forwarded).

        Args:
            session, lane: whose view it is.
            policy: the request's policy (thresholds, as clamped).
            result: the view as forwarded (below the soft threshold).
            scale, reserved: the compaction's token scale and reserved tokens.
            counter: the app's token counter.
            plan_span: runs a callable off the event loop when the request's work does.
            summarize: asks for a summary (the request's summarizer), giving its text and
                the tokens billed for the calls this process made for it.
        """
        key = (session, lane)
        memo = self._cheap.get(key)
        soft = policy.soft_threshold_tokens
        if memo is not None and result.tokens_after < memo + soft * _RECHECK_SHARE:
            return
        record = await self.load(session, lane)
        if record is not None and (self._running(record) or self._fresh(record, policy,
                                                                        result, scale)):
            return
        target = max(1, int(soft * policy.compact_to_ratio))
        found = await plan_span(lambda: compactor.prepare_span(
            result.messages, policy, counter, fingerprints=result.fingerprints,
            tokens=result.message_tokens, reserved=reserved, scale=scale, stop_below=target))
        if found is None:
            self._cheap[key] = result.tokens_after
            return
        self._cheap.pop(key, None)
        request, span = found  # type: ignore[misc]
        if record is not None and record.cache_key == span.cache_key:
            return
        if record is not None and record.state == "ready":
            self._metrics.count_prepared("unused", record.tokens)
            _log.info("prepared_summary_replaced", prepared_tokens=record.tokens)
        started = PreparedRecord(span.cut, span.prefix, span.cache_key, "running", time.time())
        if not await self._save(session, lane, started):
            return
        self._metrics.count_prepared("started", 0)
        _log.info("summary_prepare_started", prepared_messages=request.message_count)
        text, tokens = await summarize(request)
        if text is None:
            await self._save(session, lane, msgspec.structs.replace(
                started, state="failed", tokens=tokens))
            return
        await self._save(session, lane, msgspec.structs.replace(
            started, state="ready", tokens=tokens,
            summary_tokens=counter.count_value(text)))
        _log.info("summary_prepared", prepared_tokens=tokens)

    @staticmethod
    def _fresh(record: PreparedRecord, policy: CompactionPolicy,
               result: compactor.CompactionResult, scale: float) -> bool:
        """Whether a ready (or used) preparation still fits the view: the same history
        before its cut, and a crossing now would land below the target with it."""
        if record.state not in ("ready", "used"):
            return False
        prints = result.fingerprints
        if len(prints) <= record.cut or \
                compactor.prefix_print(prints[:record.cut]) != record.prefix:
            return False
        if record.state == "used":
            return True  # (the view already starts with its summary)
        covered = round(sum(result.message_tokens[1:record.cut]) * scale)
        landing = result.tokens_after - covered + record.summary_tokens
        return landing < int(policy.soft_threshold_tokens * policy.compact_to_ratio)
