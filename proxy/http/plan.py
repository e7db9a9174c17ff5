"""What a request is and how it is compacted: its body measured once (with the shared token
counts and protocol walks, or a large body's staged ones, and its compute turn), its model,
and its compaction plan (role, policy below the learnt window, calibration factors)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Mapping
from typing import Any

import msgspec
from aiohttp import web

import compactor
from policies import CompactionPolicy
from proxy.http.compute import Turn
from proxy.http.durable import SessionRef
from proxy.http.spans import RequestBody, remembered
from proxy.keys import CALIBRATION, CONFIG, COUNTER, PROTOCOL_MEMO, ROLE_POLICIES
from proxy.providers import provider_of
from proxy.state.calibration import clamp_to_window
from proxy.state.prepare import PreparedRecord

__all__ = ["CompactionPlan", "Measured", "RequestScope", "estimate", "measure", "model_of",
           "plan_compaction"]


def _reserved_tokens(counter: compactor.CachingCounter, parsed: RequestBody,
                     durable_text: str) -> int:
    """Tokens outside ``messages`` that count toward the thresholds (``system`` and
    ``tools`` counted once per decoded value)."""
    doc = parsed.doc
    reserved = 0
    for name in ("system", "tools"):  # (a loop, not a generator: this runs on every request)
        reserved += remembered(parsed.memo(name), "tokens",
                               functools.partial(counter.count_value, doc.get(name)))
    if durable_text:
        reserved += counter.count_value({"type": "text", "text": durable_text})
    return reserved


def _conversation_key(parsed: RequestBody) -> str:
    """:meth:`compactor.CompactionCheckpoint.conversation_key` of the request's messages,
    made once per decoded first user message."""
    key_of = compactor.CompactionCheckpoint.conversation_key
    for index, message in enumerate(parsed.messages):
        if message.get("role") == "user":
            return remembered(parsed.message_memo(index), "conversation_key",
                              functools.partial(key_of, [message]))
    return key_of([])


class Measured(msgspec.Struct, frozen=True):
    """What a request's body is, counted once (on the compute threads for a large body):
    its conversation key, the tokens outside ``messages`` and each message's facts."""

    conversation: str
    reserved: int
    facts: list[compactor.MessageFact] | None


def measure(counter: compactor.CachingCounter, parsed: RequestBody,
             durable_text: str) -> Measured:
    return Measured(_conversation_key(parsed), _reserved_tokens(counter, parsed, durable_text),
                    parsed.facts(counter))


class RequestScope(msgspec.Struct, frozen=True):
    """What one request works with: the token counts and tool-protocol walks it reads and
    adds to — the shared ones, or (a large body) staged ones kept only when its answer is a
    success, so a refused body leaves nothing, not even the small entries that would pin its
    memory —, and a large body's turn at the compute threads."""

    counter: compactor.CachingCounter
    memo: compactor.ProtocolMemo | compactor.StagedMemo
    turn: Turn | None = None

    @classmethod
    def of(cls, app: web.Application, parsed: RequestBody, turn: Turn | None) -> RequestScope:
        if turn is None:
            return cls(app[COUNTER], app[PROTOCOL_MEMO])
        counter, memo = app[COUNTER].staged(), app[PROTOCOL_MEMO].staged()
        parsed.on_commit(counter.commit)
        parsed.on_commit(memo.commit)
        return cls(counter, memo, turn)

    def paused(self) -> contextlib.AbstractAsyncContextManager[None]:
        """The turn given up meanwhile (a summary call)."""
        return contextlib.nullcontext() if self.turn is None else self.turn.paused()


class CompactionPlan(msgspec.Struct, frozen=True):
    """How one request is compacted: its role and policy (below the model's learnt window),
    its conversation lane, its model and the calibration factors (of the messages, and of the
    fixed part: system, tools, durable block)."""

    role: str
    policy: CompactionPolicy
    lane: str
    model: str | None
    scale: float
    reserved_scale: float
    reserved: int
    known: Mapping[int, float] | None = None
    prepared: PreparedRecord | None = None


def model_of(request: web.Request, body: dict[str, Any]) -> str | None:
    """The request's model: its body's, or on a Bedrock or Vertex path the path's."""
    provider = provider_of(request)
    model = body.get("model") if provider is None else provider.model_of(request)
    return model if isinstance(model, str) else None


def plan_compaction(app: web.Application, request: web.Request, session: SessionRef,
                    parsed: RequestBody, measured: Measured) -> CompactionPlan:
    """The request's role and policy (below the model's learnt window), its lane and the
    calibration factors of its session and model."""
    model = model_of(request, parsed.doc)
    role, policy = app[ROLE_POLICIES].select(request.headers, model)
    lane = f"{role}:{measured.conversation}"
    scale = reserved_scale = 1.0
    known = None
    if model is not None:
        calibration = app[CALIBRATION]
        policy = clamp_to_window(policy, calibration.window(session.key, model))
        if app[CONFIG].compaction.calibration:
            reserved_scale, scale = calibration.factors(session.key, model)
            known = calibration.known(session.key, model)
    return CompactionPlan(role, policy, lane, model, scale, reserved_scale, measured.reserved,
                          known)


def estimate(plan: CompactionPlan, measured: Measured) -> int | None:
    """The history's calibrated size before compaction (None: its facts were not kept)."""
    facts = measured.facts
    if facts is None:
        return None
    counted = sum(fact.tokens for fact in facts)
    return round(plan.reserved * plan.reserved_scale + counted * plan.scale)
