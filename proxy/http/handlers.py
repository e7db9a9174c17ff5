"""The request path of ``POST /v1/messages`` and ``count_tokens`` (SPEC section 1).

read -> parse -> session -> durable state -> plan (role, window, calibration) -> compact ->
append the durable block, thinking opt-out -> forward -> learn from the provider's usage. A
``prompt is too long`` refusal before the client saw a byte is compacted again below its
window and sent once more. ``count_tokens`` reads summaries from the cache only.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterable, Callable
from concurrent.futures import Executor
from typing import Any

import msgspec
import structlog
from aiohttp import web
from aiohttp.typedefs import Handler
from multidict import CIMultiDict

import compactor
from policies import CompactionPolicy
from proxy.accounting.entries import Accounting
from proxy.accounting.usage import PREPARED_ROW, ProviderUsage
from proxy.http.audit import RECORD, RequestRecord, layer_savings
from proxy.http.body import check_objects, read_body
from proxy.http.compute import OFFLOAD_FROM_BYTES, run_on
from proxy.http.durable import DurableContext, SessionRef, load_durable_context
from proxy.http.errors import RequestRejected
from proxy.http.forward import PromptTooLong, forward, upstream_request_headers
from proxy.http.plan import (
    CompactionPlan,
    Measured,
    RequestScope,
    estimate,
    measure,
    model_of,
    plan_compaction,
)
from proxy.http.prepared import (
    TimedSummarizer,
    observe_crossing,
    prepare_next,
    prepared_record,
)
from proxy.http.recent import RecentBodies
from proxy.http.services import Services
from proxy.http.session import CLAUDE_CODE_SESSION_HEADER, resolve_session_id
from proxy.http.spans import RequestBody, parse_request
from proxy.http.thinking import (
    BINDING_BETA,
    apply_binding_opt_out,
    merge_beta_header,
    needs_binding_opt_out,
)
from proxy.summary.summarizer import (
    CallerCredentials,
    ForkSource,
    Summarizer,
    summary_key,
    summary_source,
)
from proxy.telemetry.logs import bind_request_fields

__all__ = ["make_handlers"]

_log = structlog.get_logger("proxy.http.handlers")


def make_handlers(s: Services) -> dict[str, Handler]:
    """The request path's handlers by route name, each holding ``s`` (``passthrough``: every
    other path, forwarded untouched)."""
    return {"messages": functools.partial(_compact_and_forward, s, may_call_model=True),
            "count_tokens": functools.partial(_compact_and_forward, s, may_call_model=False),
            "passthrough": functools.partial(_passthrough, s)}


async def _passthrough(s: Services, request: web.Request) -> web.StreamResponse:
    request[RECORD].path = request.path
    headers = upstream_request_headers(request.headers, s.forward_policy)
    body: bytes | AsyncIterable[bytes] | None = None
    if s.provider_of(request) is not None:
        # A Bedrock or Vertex path: authorised for its exact bytes, so read whole (small).
        raw = await read_body(request, s.config.limits.max_body_bytes)
        headers.popall("Content-Encoding", None)  # read_body decoded it
        return await forward(s, request, request[RECORD], body=raw, headers=headers)
    if request.body_exists:
        body = request.content.iter_any()  # streamed as it arrives
        if request.content_length is not None:
            # The body is relayed unchanged, so its length is the one the client declared.
            headers["Content-Length"] = str(request.content_length)
    return await forward(s, request, request[RECORD], body=body, headers=headers)


def _summarizer(s: Services, request: web.Request, policy: CompactionPolicy,
                session: SessionRef, may_call_model: bool, body: dict[str, Any],
                durable: DurableContext, scope: RequestScope) -> Summarizer | None:
    """The request's L4 summarizer: the summary cache, and (``/v1/messages``) the provider,
    with the request as forwarded for a summary call forked from it (``summary.mode``)."""
    if not (s.config.summary.enabled and policy.summary_enabled):
        return None
    source: Summarizer | None = None

    async def summarize(summary: compactor.SummaryRequest) -> str | None:
        nonlocal source
        if source is None:  # made on the first summary, not for every request
            source = _summary_source(s, request, session, may_call_model, body, durable,
                                     scope.counter)
        async with scope.paused():
            return await source(summary)

    return summarize


def _summary_source(s: Services, request: web.Request, session: SessionRef,
                    may_call_model: bool, body: dict[str, Any], durable: DurableContext,
                    counter: compactor.CachingCounter,
                    prepared: Callable[[str, ProviderUsage], None] | None = None,
                    ) -> Summarizer:
    provider = s.summarizer if may_call_model else None

    def fork() -> ForkSource:
        headers = upstream_request_headers(request.headers, s.forward_policy)
        headers.popall("Content-Encoding", None)  # the call's body is the SDK's, plain JSON
        system = body.get("system")
        if durable.text:  # as forwarded: what the provider has cached
            system = compactor.append_to_system(system, durable.text)
        provider = s.provider_of(request)  # Bedrock, Vertex: the model is in the path
        parts = body if provider is None else provider.fork_parts(
            request, body, model_of(s, request, body), headers)
        return ForkSource.from_request(headers.items(), request.query_string, parts,
                                       system=system)

    def on_usage(model: str, usage: ProviderUsage) -> None:
        s.metrics.observe_provider_usage(usage, summary=True)
        # A summary made ahead has a ledger row of its own.
        row = session.key if prepared is None else session.key + PREPARED_ROW
        s.usage_ledger.add(row, model, Accounting.summary_entry(usage))
        if prepared is not None:
            prepared(model, usage)

    return summary_source(
        s.backend, provider,
        CallerCredentials.from_headers(upstream_request_headers(request.headers, s.forward_policy)),
        tenant=session.tenant, fork=fork if provider is not None else None,
        counter=counter, metrics=s.metrics, on_usage=on_usage,
        on_window=functools.partial(s.calibration.learn_window, session.key))


async def _compact(s: Services, request: web.Request, record: RequestRecord,
                   session: SessionRef, parsed: RequestBody, durable: DurableContext,
                   plan: CompactionPlan, may_call_model: bool, measured: Measured,
                   scope: RequestScope, executor: Executor | None
                   ) -> tuple[compactor.CompactionResult, bool]:
    """The compacted view, and whether its checkpoint is new (kept by :func:`_succeeded`)."""
    record.role = plan.role
    policy = plan.policy
    record.soft_threshold_tokens = policy.soft_threshold_tokens
    record.hard_limit_tokens = policy.hard_limit_tokens
    record.fixed_tokens = round(plan.reserved * plan.reserved_scale)
    s.fixed_part.check((session.tenant, session.session_id, plan.model or ""),
                          record.fixed_tokens, policy.soft_threshold_tokens,
                          policy.hard_limit_tokens)
    # Without the store (store.on_unavailable: forward) nothing sticky is reused or kept.
    sticky = s.config.compaction.sticky and durable.store_available
    checkpoint = await s.checkpoints.load(session.key, plan.lane) if sticky else None
    timed = TimedSummarizer(_summarizer(s, request, plan.policy, session, may_call_model,
                                        parsed.doc, durable, scope))
    try:
        result = await compactor.compact_context_async(
            parsed.messages,
            durable.state,
            policy=plan.policy,
            summarizer=None if timed.inner is None else timed,
            counter=scope.counter,
            options=compactor.CompactionOptions(
                reserved_tokens=plan.folded_reserved,
                sticky=sticky, checkpoint=checkpoint, copy=False, token_scale=plan.scale,
                known_tokens=plan.known, facts=measured.facts,
                protocol_memo=scope.memo,
                prepared=plan.prepared.span if plan.prepared is not None else None),
            executor=executor,
        )
    except compactor.MessageShapeError as exc:
        # The client's mistake; any other exception is a bug in a layer (a 500).
        raise RequestRejected(400, "invalid_request_error", str(exc),
                              reason="invalid_messages") from None
    record.tokens_before = result.tokens_before
    record.tokens_after = result.tokens_after
    record.layers = tuple(result.layers_applied)
    record.layer_savings = layer_savings(
        result.outcomes, reused_saved=(result.tokens_before - result.tokens_after
                                       if result.reused_checkpoint else None))
    if result.summary_request is not None and "L4" in result.layers_applied:
        record.summary_key = summary_key(session.tenant, result.summary_request.cache_key)
    record.prefix_reused = result.reused_checkpoint
    s.metrics.observe_compaction(o for o in result.outcomes if o.applied)
    if result.thrash:
        s.metrics.compaction_thrash.inc()
        _log.warning("compaction_thrash", tokens_before=result.tokens_before,
                     tokens_after=result.tokens_after)
    await observe_crossing(s, record, session, plan.lane, result, plan.prepared,
                           timed.waited_s, forwarded=may_call_model)
    return result, result.checkpoint is not None and result.checkpoint is not checkpoint


def _outgoing(s: Services, request: web.Request, parsed: RequestBody,
              result: compactor.CompactionResult, durable: DurableContext,
              headers: CIMultiDict[str]) -> bytes:
    """The body to forward: the compacted messages, the durable block appended to ``system``,
    the thinking-binding opt-out where needed."""
    body = parsed.doc
    replaced: dict[str, Any] = {}
    if durable.text:
        replaced["system"] = compactor.append_to_system(body.get("system"), durable.text)
    candidate = {**body, "messages": result.messages}
    if needs_binding_opt_out(candidate, prefix_changed=True):
        apply_binding_opt_out(candidate)
        replaced["thinking"] = candidate["thinking"]
        provider = s.provider_of(request)
        if provider is not None and provider.name == "bedrock":  # Bedrock's betas: the body's
            betas = body.get("anthropic_beta")
            listed = betas if isinstance(betas, list) else []
            replaced["anthropic_beta"] = (listed if BINDING_BETA in listed
                                          else [*listed, BINDING_BETA])
        else:
            beta = merge_beta_header(request.headers.getall("anthropic-beta", ()))
            headers.popall("anthropic-beta", None)
            headers["anthropic-beta"] = beta
    views = s.encoded_views
    return parsed.encode(result.messages, replaced, views.of(result.checkpoint),
                         views.since(result.checkpoint))


async def _compact_and_forward(s: Services, request: web.Request, *,
                               may_call_model: bool) -> web.StreamResponse:
    config = s.config
    large = (request.content_length or 0) >= OFFLOAD_FROM_BYTES
    try:
        raw = await read_body(request, config.limits.max_body_bytes)
        large = len(raw) >= OFFLOAD_FROM_BYTES
        executor = s.compute if large else None
        await run_on(executor, functools.partial(check_objects, raw,
                                                 config.limits.max_json_objects))
        return await _serve(s, request, raw, executor, may_call_model=may_call_model)
    finally:
        if large and not _accepted(request[RECORD]):
            # What a large refused body made is garbage: its pages go back to the system.
            s.compute.give_back_memory()


async def _serve(s: Services, request: web.Request, raw: bytes, executor: Executor | None, *,
                 may_call_model: bool) -> web.StreamResponse:
    config = s.config
    record = request[RECORD]
    tenant = s.tenants.tenant_of(request.headers)
    named = (request.headers.get(config.session.header)
             or request.headers.get(CLAUDE_CODE_SESSION_HEADER))
    # One large body at a time: its objects alone make the peak.
    turn = s.compute.turn() if executor is not None else None
    async with turn or contextlib.nullcontext():
        parsed = await run_on(executor, functools.partial(
            parse_request, raw, s.decoded_spans, s.recent_bodies,
            RecentBodies.key_of(tenant, named, raw), tenant=tenant))
        body = parsed.doc
        record.model = model_of(s, request, body) or record.model
        mended = parsed.mended
        if mended:
            _log.warning("lone_surrogates_replaced", replaced=mended)
        session_id = resolve_session_id(request.headers, body, config.session.header, tenant)
        session = SessionRef(session_id, tenant)
        record.session_id, record.tenant = session_id, tenant
        bind_request_fields(session_id=session_id, tenant=tenant)
        durable = await load_durable_context(s, session)
        scope = RequestScope.of(s, parsed, turn)
        measured = await run_on(executor, functools.partial(
            measure, scope.counter, parsed, durable.text))
        plan = plan_compaction(s, request, session, parsed, measured)
        prepared = await prepared_record(s, session, plan.lane, plan.policy,
                                         estimate(plan, measured))
        if prepared is not None and prepared.usable:
            plan = msgspec.structs.replace(plan, prepared=prepared)
        result, new = await _compact(s, request, record, session, parsed, durable, plan,
                                     may_call_model, measured, scope, executor)
        if may_call_model:  # (never for count_tokens)
            await prepare_next(
                s, session, plan.lane, prepared, plan.policy, result, scale=plan.scale,
                reserved=plan.folded_reserved,
                executor=executor, source=functools.partial(
                    _summary_source, s, request, session, True, body, durable, s.counter))

        headers = upstream_request_headers(request.headers, s.forward_policy)
        headers.popall("Content-Encoding", None)  # read_body decoded it
        if not result.changed and not durable.text and not mended:
            outgoing = raw
        else:
            outgoing = await run_on(executor, functools.partial(
                _outgoing, s, request, parsed, result, durable, headers))
    if not may_call_model:
        response = await forward(s, request, record, body=outgoing, headers=headers)
        if _accepted(record):
            parsed.commit()
        return response

    sent = plan, result, new  # what the provider answered last: learnt from below

    async def recompact(refusal: PromptTooLong) -> bytes | None:
        # Compact again below M, every count scaled by the ratio the refusal showed.
        nonlocal sent
        if plan.model is None:
            return None
        tokens, maximum = refusal.counts(result.tokens_after)
        s.calibration.learn_window(session.key, plan.model, maximum)
        tighter = plan.tightened(maximum, shown=max(1.0, tokens / max(1, result.tokens_after)))
        again, again_new = await _compact(s, request, record, session, parsed, durable,
                                          tighter, may_call_model, measured, scope, executor)
        sent = tighter, again, again_new
        s.metrics.recompacted.inc()
        _log.info("request_recompacted", provider_tokens=refusal.tokens,
                  provider_maximum=refusal.maximum, tokens_before=result.tokens_after,
                  tokens_after=again.tokens_after, layers=list(again.layers_applied))
        return await run_on(executor, functools.partial(
            _outgoing, s, request, parsed, again, durable, headers))

    learnt = False

    async def learn_before_end() -> None:
        # Saved before the answer ends: the next request, on any replica, is planned with it.
        nonlocal learnt
        learnt = True
        _learn(s, record, session, *sent[:2])
        await _succeeded(s, record, session, parsed, *sent)
        await s.calibration.saved(session.key)

    response = await forward(s, request, record, body=outgoing, headers=headers, retry=recompact,
                             before_end=learn_before_end)
    if not learnt:  # the answer failed or the client went away: learn what there is
        _learn(s, record, session, *sent[:2])
        await _succeeded(s, record, session, parsed, *sent)
    summarizer = s.summarizer
    if summarizer is not None and summarizer.checks_callers:
        summarizer.caller_answered(CallerCredentials.from_headers(headers),
                                   record.upstream_status)
    return response


def _accepted(record: RequestRecord) -> bool:
    status = record.upstream_status
    return status is not None and 200 <= status < 300


async def _succeeded(s: Services, record: RequestRecord, session: SessionRef,
                     parsed: RequestBody, plan: CompactionPlan,
                     result: compactor.CompactionResult, new: bool) -> None:
    """Keep what only an accepted request leaves behind: its decoded body, its new checkpoint."""
    if not _accepted(record):
        return
    parsed.commit()
    if new and result.checkpoint is not None:
        await s.checkpoints.save(session.key, plan.lane, result.checkpoint)
    recorder = s.transcripts
    if recorder is not None:
        messages = parsed.messages
        s.background.run(lambda: recorder.record(session.tenant, session.session_id,
                                                   messages),
                      failure_event="transcript_not_recorded")


def _learn(s: Services, record: RequestRecord, session: SessionRef,
           plan: CompactionPlan, result: compactor.CompactionResult) -> None:
    """Calibrate from the provider's count of the view; its usage to the metrics and ledger."""
    usage = record.usage
    if usage is None or plan.model is None or usage.prompt_tokens <= 0:
        return
    provider = usage.prompt_tokens
    error = (result.tokens_after - provider) / provider
    record.estimate_error = round(error * 100, 2)
    s.metrics.observe_estimate_error(error)
    s.metrics.observe_provider_usage(usage)
    plan.learn(s.calibration, session.key, result, provider)
    entry = s.accounting.entry(session.key, plan.lane, result.tokens_before,
                               result.tokens_after, usage)
    s.usage_ledger.add(session.key, plan.model, entry)
