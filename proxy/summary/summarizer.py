"""L4 summaries through the provider, and the summary cache in front of them.

:func:`summary_source` turns the compactor's :class:`compactor.SummaryRequest` into text: the
store's summary cache first, then (``/v1/messages`` only) one provider call per span at a time
through the anthropic SDK, in ``summary.mode`` (:mod:`proxy.summary.calls`; docs/how-it-works.md).
Any failure gives ``None``: the compactor then keeps the history as it is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qsl

import msgspec
import structlog

import compactor
from proxy.accounting.usage import ProviderUsage
from proxy.config import SummaryConfig
from proxy.providers.base import Provider
from proxy.store import ReplicaConsistency, StoreError, SummaryCache
from proxy.summary.caller_checks import AcceptedCallers, CallerCredentials
from proxy.summary.calls import (
    SUMMARIZER_MARKER,
    SUMMARY_SYSTEM_PROMPT,
    ForkSource,
    SummaryCall,
    merge_call,
    plan_calls,
    prompt_tokens,
)
from proxy.summary.client import NO_CREDENTIAL, SummaryClient, sdk, transport_client
from proxy.summary.flights import SingleFlight, fleet_single_flight
from proxy.summary.window import Refusal, SummaryWindows, refusal_of
from proxy.telemetry.metrics import ProxyMetrics

if TYPE_CHECKING:
    import anthropic

__all__ = ["SUMMARIZER_MARKER", "SUMMARY_SYSTEM_PROMPT", "CallerCredentials", "ForkSource",
           "ProviderSummarizer", "SummaryResult", "Summarizer", "UsageCallback", "summary_key",
           "summary_source"]

_log = structlog.get_logger("proxy.summary.summarizer")

#: What the compactor calls to obtain a summary: the text, or ``None`` to skip L4.
Summarizer = Callable[[compactor.SummaryRequest], Awaitable[str | None]]
#: Told the model and the provider's ``usage`` of every summary call made.
UsageCallback = Callable[[str, ProviderUsage], None]
#: Told the model and the window a refused summary call showed.
WindowCallback = Callable[[str, int], None]

# Client headers a forked call does not copy: the SDK's HTTP client decodes the answer, so it
# asks for the encodings it can decode; and the headers an SDK client sends itself to change
# how its own SDK returns the answer (they would change ours).
_NOT_COPIED: Final = frozenset({"accept-encoding", "x-stainless-raw-response",
                                "____stainless_override_cast_to"})
# Piece calls made at the same time.
_PIECE_CONCURRENCY: Final = 4


@dataclass(frozen=True)
class SummaryResult:
    """What asking the provider for one summary gave: ``outcome`` ``ok``, ``failed`` or
    ``empty``; ``pieces`` made before the merge (0: one call); ``usage`` summed over the calls;
    ``error_class`` why there is no text (an SDK exception's class name, ``EmptySummary``,
    ``SummaryTooLarge``, ``NoCredentials``)."""

    text: str | None
    outcome: str
    mode: str
    model: str | None = None
    pieces: int = 0
    usage: ProviderUsage = ProviderUsage()
    error_class: str | None = None

    def log_fields(self) -> dict[str, Any]:
        """How the summary was made, for its log line: never text, never a credential."""
        return {"mode": self.mode, "summary_model": self.model, "pieces": self.pieces,
                "usage_input": self.usage.input, "usage_cache_read": self.usage.cache_read,
                "usage_cache_write": self.usage.cache_write, "usage_output": self.usage.output}


class _NoSummary(Exception):
    """A call gave no summary: why (``error_class``) and the outcome to count."""

    def __init__(self, error_class: str, outcome: str = "failed",
                 refusal: tuple[Refusal, int] | None = None) -> None:
        super().__init__(error_class)
        self.error_class = error_class
        self.outcome = outcome
        #: ``prompt is too long``, with the proxy's count of the refused prompt.
        self.refusal = refusal


def _total(usages: Sequence[ProviderUsage]) -> ProviderUsage:
    return ProviderUsage(*map(sum, zip(*map(msgspec.structs.astuple, usages), strict=True)))


_JSON: Final = msgspec.json.Encoder()


def _call_body(call: SummaryCall, model: str, max_tokens: int) -> bytes:
    """The JSON body of ``call`` as ``messages.create`` sends it (UTF-8; a field that is
    ``None``, which the client did not send, left out), encoded in C. Raises what the SDK's
    own encoding raises on a lone surrogate (``UnicodeEncodeError``): the call fails."""
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "messages": call.messages}
    for name in ("system", "tools", "tool_choice", "metadata"):
        value = getattr(call, name)
        if value is not None:
            body[name] = value
    return _JSON.encode(body)


@dataclass
class _Calls:
    """One summary's calls: where they go and what they cost."""

    client: anthropic.AsyncAnthropic
    model: str
    headers: dict[str, str | anthropic.Omit]
    query: dict[str, str]
    on_usage: UsageCallback | None
    usages: list[ProviderUsage]
    counter: compactor.CachingCounter | None = None


class ProviderSummarizer:
    """One SDK client per app, and the summary calls running in it (:attr:`flights`);
    ``api_key`` is ``summary.api_key_env``'s key, ``None`` to use each caller's own."""

    def __init__(self, config: SummaryConfig, base_url: str, api_key: str | None, *,
                 provider: Provider | None = None) -> None:
        self.config = config
        self.flights: SingleFlight[str | None] = SingleFlight()
        self.windows = SummaryWindows(config)
        self._api_key = api_key
        # Bedrock, Vertex: the calls go out in their format, signed with the proxy's own
        # credentials when the client sent none.
        self._signs_calls = provider is not None and provider.signs_calls
        self._client = SummaryClient(
            transport_client(provider, config.timeout_s) if self._signs_calls else None,
            api_key=api_key or NO_CREDENTIAL, base_url=base_url,
            max_retries=config.max_retries, timeout=config.timeout_s)
        # The operator's key pays for separate calls: only for callers the provider accepted.
        self._callers = (AcceptedCallers(self._client.get)
                         if api_key is not None and config.mode == "separate" else None)

    async def close(self) -> None:
        """Cancel the summary calls still running, and close the SDK client's connections."""
        await self.flights.close()
        if self._callers is not None:
            await self._callers.close()
        await self._client.close()

    async def may_call_for(self, caller: CallerCredentials) -> bool:
        """Whether a summary call may be made for ``caller``: on the operator's key, only
        once the provider has accepted the caller's own credential."""
        return self._callers is None or await self._callers.accepted(caller)

    @property
    def checks_callers(self) -> bool:
        """Whether callers are checked before the operator's key is spent for them."""
        return self._callers is not None

    def caller_answered(self, caller: CallerCredentials, status: int | None) -> None:
        """The provider answered the caller's forwarded request with ``status``."""
        if self._callers is not None:
            self._callers.answered(caller, status)

    def _separate_headers(self, caller: CallerCredentials
                          ) -> dict[str, str | anthropic.Omit] | None:
        """Per-call auth: the configured key (the client's own), else the caller's headers."""
        if self._api_key is not None:
            return {}
        if caller.present or self._signs_calls:  # (the provider's transport authorises)
            return caller.as_extra_headers()
        return None

    def _fork_headers(self, source: ForkSource) -> dict[str, str | anthropic.Omit] | None:
        """The client's headers (repeated ones comma-joined), every SDK header it did not send
        omitted; ``None`` when it sent no credential."""
        sent: dict[str, str] = {}
        names: dict[str, str] = {}
        for name, value in source.headers:
            lowered = name.lower()
            if lowered in _NOT_COPIED:
                continue
            first = names.setdefault(lowered, name)
            sent[first] = f"{sent[first]}, {value}" if first in sent else value
        if "x-api-key" not in names and "authorization" not in names and not self._signs_calls:
            return None
        headers: dict[str, str | anthropic.Omit] = {
            name: sdk().omit for name in sorted(self._client.omitted_headers - names.keys())
        }
        headers.update(sent)
        return headers

    async def summarize(self, request: compactor.SummaryRequest, caller: CallerCredentials, *,
                        fork: ForkSource | None = None,
                        counter: compactor.CachingCounter | None = None,
                        on_usage: UsageCallback | None = None,
                        on_window: WindowCallback | None = None) -> SummaryResult:
        """Ask the provider for a summary of ``request``; never raises. Without ``fork`` the
        call is ``separate``; without ``counter`` every call is taken as fitting; a call
        refused as too long tells ``on_window`` and is made again in pieces that fit."""
        source = fork if self.config.mode == "fork" else None
        mode = "fork" if source is not None else "separate"
        client = await self._client.get()
        headers = (self._fork_headers(source) if source is not None
                   else self._separate_headers(caller))
        if headers is None:
            return SummaryResult(None, "failed", mode, error_class="NoCredentials")
        model = self.config.call_model(source.model if source is not None else None)
        query = (dict(parse_qsl(source.query_string, keep_blank_values=True))
                 if source is not None else {})
        calls = _Calls(client=client, model=model, headers=headers, query=query,
                       on_usage=on_usage, usages=[], counter=counter)
        pieces = 0
        for attempt in range(2):  # again in pieces once a refusal taught the window
            budget = self.windows.budget(model)
            try:
                planned = plan_calls(request, source, counter=counter, budget=budget)
                if planned is None:
                    raise _NoSummary("SummaryTooLarge")
                pieces = len(planned) if len(planned) > 1 else 0
                texts = await self._each(planned, calls)
                text = texts[0]
                if pieces:
                    merge = merge_call(source, texts)
                    if counter is not None and prompt_tokens(merge, counter) > budget:
                        raise _NoSummary("SummaryTooLarge")
                    text = await self._call(merge, calls)
            except _NoSummary as exc:
                if exc.refusal is not None and on_window is not None:
                    on_window(model, exc.refusal[0].maximum)
                if exc.refusal is None or attempt or counter is None or \
                        self.windows.learn(model, *exc.refusal) >= budget:
                    return SummaryResult(None, exc.outcome, mode, model, pieces,
                                         _total(calls.usages), exc.error_class)
                _log.info("summary_window_learnt", provider_maximum=exc.refusal[0].maximum,
                          provider_tokens=exc.refusal[0].tokens)
                continue
            return SummaryResult(text, "ok", mode, model, pieces, _total(calls.usages))
        raise AssertionError("unreachable")  # (the loop returns)

    async def _each(self, planned: Sequence[SummaryCall], calls: _Calls) -> list[str]:
        """The text of every call, made a few at a time; the first failure cancels the rest."""
        if len(planned) == 1:
            return [await self._call(planned[0], calls)]
        gate = asyncio.Semaphore(_PIECE_CONCURRENCY)

        async def gated(call: SummaryCall) -> str:
            async with gate:
                return await self._call(call, calls)

        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(gated(call)) for call in planned]
        except BaseExceptionGroup as failed:
            first = next((e for e in failed.exceptions if isinstance(e, _NoSummary)), None)
            if first is None:
                raise
            raise first from None
        return [task.result() for task in tasks]

    async def _call(self, call: SummaryCall, calls: _Calls) -> str:
        """One call's text (text blocks only); :class:`_NoSummary` when there is none."""
        anthropic = sdk()
        try:
            # The SDK's own client (its credentials, base URL, timeout, retries, errors and
            # answer), given the body as bytes: ``messages.create`` would copy the whole
            # conversation and encode it again with ``json``.
            message = await calls.client.post(
                "/v1/messages", cast_to=anthropic.types.Message,
                content=_call_body(call, calls.model, self.config.max_tokens),
                options={"headers": calls.headers, "params": calls.query})
            usage = ProviderUsage.from_usage(message.usage.model_dump())
            text = "".join(block.text for block in message.content
                           if isinstance(block, anthropic.types.TextBlock)).strip()
        except Exception as exc:  # noqa: BLE001 - any failure means "no summary", never a 500
            refusal = refusal_of(exc) if isinstance(exc, anthropic.BadRequestError) else None
            counted = (prompt_tokens(call, calls.counter)
                       if refusal is not None and calls.counter is not None else 0)
            raise _NoSummary(type(exc).__name__,
                             refusal=(refusal, counted) if refusal is not None else None) \
                from None
        calls.usages.append(usage)
        if calls.on_usage is not None:
            calls.on_usage(calls.model, usage)
        if not text:
            raise _NoSummary("EmptySummary", "empty")
        return text


def summary_key(tenant: str, cache_key: str) -> str:
    """The summary cache's key of a span's summary for ``tenant`` (each tenant's own,
    ``none``'s unprefixed); the audit log keeps it so the console can show the text."""
    return cache_key if tenant == "none" else f"{tenant}/{cache_key}"


def summary_source(store: SummaryCache, provider: ProviderSummarizer | None,
                   caller: CallerCredentials, *, tenant: str = "none",
                   fork: Callable[[], ForkSource] | None = None,
                   counter: compactor.CachingCounter | None = None,
                   metrics: ProxyMetrics | None = None,
                   on_usage: UsageCallback | None = None,
                   on_window: WindowCallback | None = None) -> Summarizer:
    """The summarizer the compactor gets for one request: the tenant's summary cache first,
    then ``provider`` (``None``: cache only, as for ``count_tokens``). A request needing a
    summary already asked for waits for that call (at most ``summary.timeout_s``); with a
    shared store the call is the fleet's (:func:`~proxy.summary.flights.fleet_single_flight`).
    ``fork`` makes the request fork mode copies, only when a call is made."""

    def count(outcome: str) -> None:
        if metrics is not None:
            metrics.count_summary(outcome)

    # Other processes share the cache: one of them makes each summary (a lease per key).
    fleet = store if isinstance(store, ReplicaConsistency) and store.shared else None

    async def cached(key: str) -> str | None:
        try:
            text = await store.get_summary(key)
        except StoreError as exc:  # the cache is an optimisation: a summary is still made
            _log.warning("summary_cache_unreadable", error_class=type(exc).__name__)
            return None
        if text:
            count("cached")
            _log.info("summary_ready", cached=True)
            return text
        return None

    async def call(key: str, request: compactor.SummaryRequest) -> str | None:
        assert provider is not None
        # A call that ended while this request read the cache has written it meanwhile.
        text = await cached(key)
        if text is not None:
            return text
        if fleet is None:
            return await make(key, request)

        async def made_elsewhere() -> str | None:
            return await store.get_summary(key) or None

        text, outcome = await fleet_single_flight(
            fleet, f"summary:{key}", made_elsewhere, lambda: make(key, request),
            timeout_s=provider.config.timeout_s)
        if outcome in ("joined", "found"):
            count("joined")
            _log.info("summary_ready", cached=True, fleet=outcome)
        elif outcome == "timeout":
            _log.warning("summary_failed", error_class="FleetJoinTimeout", joined=True)
        return text

    async def make(key: str, request: compactor.SummaryRequest) -> str | None:
        assert provider is not None
        result = await provider.summarize(request, caller,
                                          fork=fork() if fork is not None else None,
                                          counter=counter, on_usage=on_usage,
                                          on_window=on_window)
        count(result.outcome)
        if result.text is None:
            _log.warning("summary_failed", error_class=result.error_class,
                         **result.log_fields())
            return None
        try:
            await store.put_summary(key, result.text)
        except StoreError as exc:  # kept for this view; the next crossing asks again
            _log.warning("summary_not_cached", error_class=type(exc).__name__)
        _log.info("summary_ready", cached=False, **result.log_fields())
        return result.text

    async def summarize(request: compactor.SummaryRequest) -> str | None:
        key = summary_key(tenant, request.cache_key)
        flight = provider.flights.running(key) if provider is not None else None
        if flight is None:
            text = await cached(key)
            if text is not None or provider is None:
                return text
            if not await provider.may_call_for(caller):
                count("failed")
                _log.warning("summary_failed", error_class="CallerNotAccepted",
                             mode="separate")
                return None
            flight = provider.flights.running(key)
            if flight is None:
                # Shielded: a client that goes away stops waiting, the call goes on.
                return await asyncio.shield(provider.flights.start(
                    key, lambda: call(key, request)))
        assert provider is not None  # a running call is the provider's
        count("joined")
        try:
            return await asyncio.wait_for(asyncio.shield(flight), provider.config.timeout_s)
        except TimeoutError:
            _log.warning("summary_failed", error_class="JoinTimeout", joined=True)
            return None

    return summarize
