"""What a request is and how it is compacted: its body measured once (with the shared token
counts and protocol walks, or a large body's staged ones, and its compute turn), its model,
and its compaction plan (role, policy below the learnt window, calibration factors)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec
from aiohttp import web

import compactor
from policies import CompactionPolicy
from proxy.calibration.local import Calibration, clamp_to_window
from proxy.http.compute import Turn
from proxy.http.durable import SessionRef
from proxy.http.spans import RequestBody, remembered
from proxy.summary.prepare import PreparedRecord

if TYPE_CHECKING:
    from proxy.http.services import Services

__all__ = ["CompactionPlan", "Measured", "RequestScope", "estimate", "measure", "model_of",
           "plan_compaction"]


def _reserved_tokens(counter: compactor.CachingCounter, parsed: RequestBody,
                     durable_text: str) -> int:
    """Tokens outside ``messages`` that count toward the thresholds."""
    doc = parsed.doc
    reserved = 0
    for name in ("system", "tools"):  # (a loop, not a generator: this runs on every request)
        reserved += remembered(parsed.memo(name), "tokens",
                               functools.partial(counter.count_value, doc.get(name)))
    if durable_text:
        reserved += counter.count_value({"type": "text", "text": durable_text})
    return reserved


def _conversation_key(parsed: RequestBody) -> str:
    """The conversation key of the request's messages, once per decoded first user message."""
    key_of = compactor.CompactionCheckpoint.conversation_key
    for index, message in enumerate(parsed.messages):
        if message.get("role") == "user":
            return remembered(parsed.message_memo(index), "conversation_key",
                              functools.partial(key_of, [message]))
    return key_of([])


class Measured(msgspec.Struct, frozen=True):
    """A request's body counted once: its conversation key, tokens outside ``messages``, facts."""

    conversation: str
    reserved: int
    facts: list[compactor.MessageFact] | None


def measure(counter: compactor.CachingCounter, parsed: RequestBody,
             durable_text: str) -> Measured:
    return Measured(_conversation_key(parsed), _reserved_tokens(counter, parsed, durable_text),
                    parsed.facts(counter))


class RequestScope(msgspec.Struct, frozen=True):
    """A request's token counts and tool-protocol walks (a large body's staged, kept only
    when its answer is a success) and a large body's turn at the compute threads."""

    counter: compactor.CachingCounter
    memo: compactor.ProtocolMemo | compactor.StagedMemo
    turn: Turn | None = None

    @classmethod
    def of(cls, s: Services, parsed: RequestBody, turn: Turn | None) -> RequestScope:
        if turn is None:
            return s.shared_scope
        counter, memo = s.counter.staged(), s.protocol_memo.staged()
        parsed.on_commit(counter.commit)
        parsed.on_commit(memo.commit)
        return cls(counter, memo, turn)

    def paused(self) -> contextlib.AbstractAsyncContextManager[None]:
        return contextlib.nullcontext() if self.turn is None else self.turn.paused()


class CompactionPlan(msgspec.Struct, frozen=True):
    """How one request is compacted: role, policy (below the learnt window), lane, model and
    the calibration factors of the messages and of the fixed part."""

    role: str
    policy: CompactionPolicy
    lane: str
    model: str | None
    scale: float
    reserved_scale: float
    reserved: int
    known: Mapping[int, float] | None = None
    prepared: PreparedRecord | None = None

    @property
    def folded_reserved(self) -> int:
        """The fixed part with its own factor folded in (the compactor scales all by ``scale``)."""
        return round(self.reserved * self.reserved_scale / self.scale)

    def tightened(self, maximum: int, shown: float) -> CompactionPlan:
        """The plan for compacting again below a refusal's window ``maximum``, every count
        scaled by the ratio ``shown`` (the per-message counts are no longer trusted)."""
        return msgspec.structs.replace(
            self, policy=clamp_to_window(self.policy, maximum), scale=self.scale * shown,
            reserved_scale=self.reserved_scale * shown, known=None)

    def learn(self, calibration: Calibration, session_key: str,
              result: compactor.CompactionResult, provider_tokens: int) -> None:
        """Teach the session's calibration the provider's count of the view sent."""
        if self.model is None:
            return
        calibration.observe(session_key, self.model,
                            result.counted_after - self.folded_reserved + self.reserved,
                            provider_tokens, self.reserved, result.fingerprints,
                            result.message_tokens)


def model_of(s: Services, request: web.Request, body: dict[str, Any]) -> str | None:
    """The request's model: its body's, or on a Bedrock or Vertex path the path's."""
    provider = s.provider_of(request)
    model = body.get("model") if provider is None else provider.model_of(request)
    return model if isinstance(model, str) else None


def plan_compaction(s: Services, request: web.Request, session: SessionRef,
                    parsed: RequestBody, measured: Measured) -> CompactionPlan:
    """The request's :class:`CompactionPlan`."""
    model = model_of(s, request, parsed.doc)
    role, policy = s.role_policies.select(request.headers, model)
    lane = f"{role}:{measured.conversation}"
    scale = reserved_scale = 1.0
    known = None
    if model is not None:
        calibration = s.calibration
        policy = clamp_to_window(policy, calibration.window(session.key, model))
        if s.config.compaction.calibration:
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
