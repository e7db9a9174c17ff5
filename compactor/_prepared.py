"""Summaries made ahead: the span the next crossing would cut, summarised before it comes.

A session whose view nears the soft threshold gets its L4 summary made off the request path
(the proxy decides when, :mod:`proxy.summary.prepare`). :func:`prepare_span` names the span:
the request L4 would make of the view as it stands, keeping verbatim only what an inline
summary keeps less the growth still to come (:func:`keep_for_crossing`: the crossing lands
where an inline one would), and a :class:`PreparedSpan` saying which messages it covers (how
many from the start, and the fingerprints of that prefix). At the crossing,
:func:`use_prepared` cuts the grown view at the same place: when the view still starts with
that prefix and the plan gives the same span (the same cache key), the prepared summary
stands for it and every later message stays (through L1 and L2, as at any crossing). When
that is not below the target, the caller goes on as without a preparation (L1 to L4 with a
summary made inline).
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Final

import msgspec
import xxhash

from policies import CompactionPolicy

from ._blocks import Message
from ._l4_summary import SummaryPlan, SummaryRequest, apply_summary, plan_summary
from ._protocol import Interaction, validate_tool_protocol
from ._record import span_record
from ._tokens import CachingCounter
from ._turns import has_tool_result
from ._view import View

if TYPE_CHECKING:
    from ._pipeline import LayerOutcome

__all__ = ["PREPARED_DETAIL", "PreparedSpan", "prefix_print", "prepare_span",
           "prepared_request"]

#: A message's tokens beside its tool result's text (an estimate of one cut by L1).
_MESSAGE_TOKENS: Final = 50

#: The detail of L4's outcome when a prepared summary served the crossing.
PREPARED_DETAIL = "prepared summary"


class PreparedSpan(msgspec.Struct, frozen=True):
    """Which messages a summary made ahead covers.

    Attributes:
        cut: how many messages of the view, from the first, the plan covered (head, span
            and everything before the kept recent turns).
        prefix: :func:`prefix_print` of those messages.
        cache_key: the summary request's cache key (the same span, the same key).
    """

    cut: int
    prefix: int
    cache_key: str


def prefix_print(fingerprints: Sequence[int]) -> int:
    """One 64-bit hash of a run of message fingerprints (the same in every process)."""
    digest = xxhash.xxh3_64()
    for value in fingerprints:
        digest.update(value.to_bytes(8, "little", signed=False))
    return digest.intdigest()


def prepare_span(messages: list[Message], policy: CompactionPolicy,
                 counter: CachingCounter | None = None, *,
                 fingerprints: Sequence[int] | None = None, tokens: Sequence[int] | None = None,
                 reserved: int = 0, scale: float = 1.0, stop_below: int | None = None,
                 ) -> tuple[SummaryRequest, PreparedSpan] | None:
    """The summary request L4 would make of ``messages`` (a view as forwarded) now, and the
    span it covers; None when there is nothing to summarise, or (with ``stop_below``, the
    target a crossing compacts to) when the cheap layers alone would reach it: then the
    crossing makes no summary, and a prepared one would be paid for nothing.
    ``fingerprints`` and ``tokens`` (a :class:`~compactor.CompactionResult`'s) spare counting
    the view again; ``reserved`` and ``scale`` are the pipeline's (see
    :class:`~compactor.CompactionOptions`)."""
    view = View(messages, counter if counter is not None else CachingCounter(None), reserved,
                fingerprints=list(fingerprints) if fingerprints is not None else None,
                tokens=list(tokens) if tokens is not None else None, scale=scale)
    interactions = validate_tool_protocol(messages)
    if stop_below is not None and _cheap_layers_reach(view, interactions, policy, stop_below):
        return None
    keep = keep_for_crossing(view, policy)
    plan = plan_summary(view, interactions, keep, to_end=keep == 0)
    if plan is None:
        return None
    cut = len(plan.request.conversation)
    return plan.request, PreparedSpan(cut, prefix_print(view.fingerprints[:cut]),
                                      plan.request.cache_key)


def keep_for_crossing(view: View, policy: CompactionPolicy) -> int:
    """How many recent messages a preparation of ``view`` keeps verbatim: so few that, with
    the growth still to come before the crossing (up to the soft threshold, and half an
    exchange past it: the request that crosses it), the crossing's verbatim tail weighs what
    an inline summary keeps (its ``summary_keep_recent`` last messages, tool results as L1
    cuts them), so it lands where an inline crossing would and the next one is as far. None
    (the span runs to the end) only after a tool answer: a person's message is never
    summarised before it is answered."""
    keep = policy.summary_keep_recent
    tokens = view.tokens
    scale = view.scale or 1.0
    cap = policy.max_tool_result_tokens + _MESSAGE_TOKENS
    recent = [min(size, cap) for size in tokens[len(tokens) - keep:]] if keep else []
    growth = max(0, policy.soft_threshold_tokens - view.total()) / scale + \
        sum(min(size, cap) for size in tokens[-2:]) / 2
    budget = sum(recent) - growth
    kept = 0
    for size in reversed(recent):
        budget -= size
        if budget < 0:
            break
        kept += 1
    if kept == 0 and not has_tool_result(view.messages[-1]):
        return 1
    return kept


def _cheap_layers_reach(view: View, interactions: dict[str, Interaction],
                        policy: CompactionPolicy, stop_below: int) -> bool:
    """Whether L1 to L3 would take ``view``, grown to the soft threshold, below
    ``stop_below``: what they leave of it now, plus the growth still to come (taken as
    kept whole: the first message and the recent ones are what L3 keeps)."""
    from ._pipeline import LAYERS

    growth = max(0, policy.soft_threshold_tokens - view.total())
    for layer in LAYERS:
        view, changed = layer.run(view, interactions, policy)
        if view.total() + growth < stop_below:
            return True
        if layer.reshapes and changed:
            interactions = validate_tool_protocol(view.messages)
    return False


def prepared_request(messages: list[Message], prepared: PreparedSpan,
                counter: CachingCounter | None = None, *,
                fingerprints: Sequence[int] | None = None, tokens: Sequence[int] | None = None,
                reserved: int = 0, scale: float = 1.0) -> SummaryRequest | None:
    """The summary request of ``prepared``'s span, made again from ``messages`` (the view
    grown since): to ask again for a preparation whose call was lost. None when the view
    no longer holds that span."""
    view = View(messages, counter if counter is not None else CachingCounter(None), reserved,
                fingerprints=list(fingerprints) if fingerprints is not None else None,
                tokens=list(tokens) if tokens is not None else None, scale=scale)
    plan = _plan_at(view, validate_tool_protocol(messages), prepared)
    return None if plan is None else plan.request


def _plan_at(view: View, interactions: Mapping[str, Interaction],
             prepared: PreparedSpan) -> SummaryPlan | None:
    """L4's plan of ``view`` cut where ``prepared`` was, when it is the same span."""
    cut = prepared.cut
    if len(view.messages) <= cut or prefix_print(view.fingerprints[:cut]) != prepared.prefix:
        return None
    plan = plan_summary(view, interactions, len(view.messages) - cut)
    if plan is None or plan.request.cache_key != prepared.cache_key:
        return None
    if len(plan.request.conversation) != cut:
        return None
    return plan


def use_prepared(view: View, interactions: dict[str, Interaction], policy: CompactionPolicy,
                 stop_below: int, prepared: PreparedSpan,
                 ) -> Generator[SummaryRequest, str | None,
                                tuple[View, list[LayerOutcome], SummaryRequest] | None]:
    """``view`` with the prepared span replaced by its summary (yielded for, as L4 does),
    the later messages kept, then L1 and L2 (as at any crossing).
    None: the preparation does not fit this view (another span, no summary, or too large a
    tail): the caller compacts as without it."""
    from ._pipeline import LAYERS, LayerOutcome  # (the pipeline imports this module)

    plan = _plan_at(view, interactions, prepared)
    if plan is None:
        return None
    text = yield plan.request
    if not isinstance(text, str) or not text.strip():
        return None
    # What the span's user typed and its artifact trail stay verbatim beside the summary, as
    # with a summary made at the crossing.
    kept = span_record(plan.middle, policy, view.counter.count_text)
    summarised = apply_summary(view, plan, text, kept.render())
    outcomes = [LayerOutcome("L4", view.total(), summarised.total(),
                             view.total() - summarised.total(), plan.request.message_count,
                             True, PREPARED_DETAIL)]
    current = summarised
    for layer in LAYERS:
        # L1 and L2 as at an inline crossing (which runs them before L4); never L3 (that
        # would cut what the summary's verbatim tail is for).
        if layer.name not in ("L1", "L2"):
            continue
        before = current
        current, changed = layer.run(before, validate_tool_protocol(before.messages), policy)
        outcomes.append(LayerOutcome(layer.name, before.total(), current.total(),
                                     before.total() - current.total(), changed, changed > 0))
    if current.total() >= stop_below:
        return None
    return current, outcomes, plan.request
