"""The request path of ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

One visible sequence (SPEC section 1), each step its own function::

    read (size limit) -> parse -> resolve session -> load + resolve durable state
    -> pick role policy -> compact (validates the tool protocol first; sticky: from the
       session's checkpoint) -> keep the new checkpoint
    -> append durable block to system -> thinking-binding opt-out -> forward -> relay

``count_tokens`` runs the same steps with a summarizer that only reads the summary cache, so
it counts exactly the view the next ``/v1/messages`` would send and never calls a model.
A request that fails any step is answered by :mod:`proxy.http.errors` and never forwarded.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import structlog
from aiohttp import web
from multidict import CIMultiDict

import compactor
from policies import CompactionPolicy
from proxy.http.audit import RECORD, RequestRecord
from proxy.http.body import (
    dump_body,
    may_hold_lone_surrogates,
    parse_body,
    read_body,
    replace_lone_surrogates,
)
from proxy.http.errors import RequestRejected
from proxy.http.forward import forward, request_body_stream, upstream_request_headers
from proxy.http.session import resolve_session_id
from proxy.http.tenants import scoped_key
from proxy.http.thinking import apply_binding_opt_out, merge_beta_header, needs_binding_opt_out
from proxy.keys import (
    CHECKPOINTS,
    CONFIG,
    COUNTER,
    METRICS,
    RESOLVERS,
    ROLE_POLICIES,
    STORE,
    SUMMARIES,
    SUMMARIZER,
    TENANTS,
)
from proxy.state.summarizer import CallerCredentials, Summarizer, summary_source

__all__ = ["count_tokens_handler", "messages_handler", "passthrough_handler"]

_log = structlog.get_logger("proxy.http.handlers")


@dataclass(frozen=True)
class DurableContext:
    """A session's durable state and its rendered block (``""`` when there is none)."""

    state: compactor.DurableContextState | None
    text: str


async def messages_handler(request: web.Request) -> web.StreamResponse:
    """``POST /v1/messages``: compact, inject durable context, forward, relay."""
    return await _compact_and_forward(request, may_call_model=True)


async def count_tokens_handler(request: web.Request) -> web.StreamResponse:
    """``POST /v1/messages/count_tokens``: the same view, summaries from the cache only."""
    return await _compact_and_forward(request, may_call_model=False)


async def passthrough_handler(request: web.Request) -> web.StreamResponse:
    """Every other path and method: forwarded untouched, the body streamed as it arrives."""
    headers = upstream_request_headers(request.headers)
    body = None
    if request.body_exists:
        body = request_body_stream(request)
        if request.content_length is not None:
            # The body is relayed unchanged, so its length is the one the client declared.
            headers["Content-Length"] = str(request.content_length)
    return await forward(request, request[RECORD], body=body, headers=headers)


@dataclass(frozen=True)
class SessionRef:
    """A request's session: the client's own id, its tenant, and the key the store knows it
    by (:func:`proxy.http.tenants.scoped_key`)."""

    session_id: str
    tenant: str

    @property
    def key(self) -> str:
        """The store key of this tenant's session."""
        return scoped_key(self.tenant, self.session_id)


async def load_durable_context(app: web.Application, session: SessionRef) -> DurableContext:
    """The session's state with every source pointer verified, rendered for ``system``.

    The resolver reads files (transcripts, artifact hashes), so it runs in a worker thread;
    it is the session's long-lived one, so unchanged files are not read again. Pointers are
    authorized against the client's own session id.
    """
    session_id = session.session_id
    stored = await app[STORE].get_state(session.key)
    if stored is None or stored.state.is_empty:
        return DurableContext(None if stored is None else stored.state, "")
    resolver = app[RESOLVERS].for_session(session_id)
    resolutions = await asyncio.to_thread(compactor.resolve_durable_sources, stored.state, resolver)
    text = compactor.render_durable_context(stored.state, source_resolutions=resolutions)
    return DurableContext(stored.state, text)


def _summarizer(request: web.Request, policy: CompactionPolicy, tenant: str,
                may_call_model: bool) -> Summarizer | None:
    app = request.app
    if not (app[CONFIG].summary.enabled and policy.summary_enabled):
        return None
    provider = app.get(SUMMARIZER) if may_call_model else None
    return summary_source(app[SUMMARIES], provider, CallerCredentials.from_headers(request.headers),
                          tenant=tenant)


def _reserved_tokens(app: web.Application, body: dict[str, Any], durable_text: str) -> int:
    """Tokens outside ``messages`` that count toward the thresholds."""
    counter = app[COUNTER]
    reserved = counter.count_value(body.get("system")) + counter.count_value(body.get("tools"))
    if durable_text:
        reserved += counter.count_value({"type": "text", "text": durable_text})
    return reserved


async def _compact(request: web.Request, record: RequestRecord, session: SessionRef,
                   body: dict[str, Any], durable: DurableContext,
                   may_call_model: bool) -> compactor.CompactionResult:
    app = request.app
    model = body.get("model")
    role, policy = app[ROLE_POLICIES].select(
        request.headers, model if isinstance(model, str) else None
    )
    record.role = role
    sticky = app[CONFIG].compaction.sticky
    lane = f"{role}:{compactor.CompactionCheckpoint.conversation_key(body['messages'])}"
    checkpoint = await app[CHECKPOINTS].load(session.key, lane) if sticky else None
    try:
        result = await compactor.compact_context_async(
            body["messages"],
            durable.state,
            policy=policy,
            summarizer=_summarizer(request, policy, session.tenant, may_call_model),
            counter=app[COUNTER],
            options=compactor.CompactionOptions(
                reserved_tokens=_reserved_tokens(app, body, durable.text),
                sticky=sticky, checkpoint=checkpoint, copy=False),
        )
    except compactor.MessageShapeError as exc:
        # A block that is not an object, a content of the wrong type: the client's mistake.
        # Any other exception is a bug in a layer: the error middleware's 500, never a 400.
        raise RequestRejected(400, "invalid_request_error", str(exc),
                              reason="invalid_messages") from None
    # count_tokens only looks: the next /v1/messages keeps the checkpoint it makes.
    if may_call_model and result.checkpoint is not None and result.checkpoint is not checkpoint:
        await app[CHECKPOINTS].save(session.key, lane, result.checkpoint)
    record.tokens_before = result.tokens_before
    record.tokens_after = result.tokens_after
    record.layers = tuple(result.layers_applied)
    app[METRICS].observe_compaction(o for o in result.outcomes if o.applied)
    return result


async def _compact_and_forward(request: web.Request, *, may_call_model: bool) -> web.StreamResponse:
    app = request.app
    config = app[CONFIG]
    record = request[RECORD]
    raw = await read_body(request, config.limits.max_body_bytes)
    body = parse_body(raw)
    mended = replace_lone_surrogates(body) if may_hold_lone_surrogates(raw) else 0
    if mended:
        _log.warning("lone_surrogates_replaced", replaced=mended)
    tenant = app[TENANTS].tenant_of(request.headers)
    session_id = resolve_session_id(request.headers, body, config.session.header, tenant)
    session = SessionRef(session_id, tenant)
    record.session_id, record.tenant = session_id, tenant
    structlog.contextvars.bind_contextvars(session_id=session_id, tenant=tenant)
    durable = await load_durable_context(app, session)
    result = await _compact(request, record, session, body, durable, may_call_model)

    headers = upstream_request_headers(request.headers)
    headers.popall("Content-Encoding", None)  # read_body decoded it: the body goes out plain
    if not result.changed and not durable.text and not mended:
        # Nothing to rewrite: the client's bytes go out as they came.
        return await forward(request, record, body=raw, headers=headers)
    body["messages"] = result.messages
    if durable.text:
        body["system"] = compactor.append_to_system(body.get("system"), durable.text)
    if needs_binding_opt_out(body, prefix_changed=True):
        apply_binding_opt_out(body)
        _set_beta(headers, merge_beta_header(request.headers.getall("anthropic-beta", ())))
    return await forward(request, record, body=dump_body(body), headers=headers)


def _set_beta(headers: CIMultiDict[str], value: str) -> None:
    headers.popall("anthropic-beta", None)
    headers["anthropic-beta"] = value
