"""Summaries made ahead: the span the next crossing would cut, summarised before it comes.

The proxy decides when (:mod:`proxy.summary.prepare`). :func:`prepare_span` names the span L4
would cut now, keeping verbatim only what an inline summary keeps less the growth still to come,
so the crossing lands where an inline one would. At the crossing, :func:`use_prepared` cuts the
grown view at the same place (same prefix, same cache key) and keeps every later message, with
L1 and L2; when that is not below the target, the crossing compacts as without it.
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
from ._tokens import CachingCounter, as_caching
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
    """Which messages a summary made ahead covers: the first ``cut`` of the view (up to the
    kept recent turns), their :func:`prefix_print` and the request's ``cache_key``."""

    cut: int
    prefix: int
    cache_key: str


def prefix_print(fingerprints: Sequence[int]) -> int:
    """One 64-bit hash of a run of message fingerprints (the same in every process)."""
    return xxhash.xxh3_64_intdigest(b"".join(value.to_bytes(8, "little") for value in fingerprints))


def prepare_span(messages: list[Message], policy: CompactionPolicy,
                 counter: CachingCounter | None = None, *,
                 fingerprints: Sequence[int] | None = None, tokens: Sequence[int] | None = None,
                 reserved: int = 0, scale: float = 1.0, stop_below: int | None = None,
                 ) -> tuple[SummaryRequest, PreparedSpan] | None:
    """The summary request L4 would make of ``messages`` (a view as forwarded) now, and the
    span it covers; None when there is nothing to summarise or the cheap layers alone would
    reach ``stop_below`` (the crossing's target). ``fingerprints`` and ``tokens`` (a
    :class:`~compactor.CompactionResult`'s) spare counting the view again."""
    view = View(messages, as_caching(counter), reserved,
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
    """How many recent messages a preparation keeps verbatim: so few that, with the growth
    still to come (to the soft threshold and half an exchange past it), the crossing's tail
    weighs what an inline summary keeps. None only after a tool answer: a person's message is
    never summarised before it is answered."""
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
    """Whether L1 to L3 would take ``view``, grown to the soft threshold (the growth kept
    whole), below ``stop_below``."""
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
    grown since), to ask again for a lost one; None when the view no longer holds it."""
    view = View(messages, as_caching(counter), reserved,
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
    if (plan is None or plan.request.cache_key != prepared.cache_key
            or len(plan.request.conversation) != cut):
        return None
    return plan


def use_prepared(view: View, interactions: dict[str, Interaction], policy: CompactionPolicy,
                 stop_below: int, prepared: PreparedSpan,
                 ) -> Generator[SummaryRequest, str | None,
                                tuple[View, list[LayerOutcome], SummaryRequest] | None]:
    """``view`` with the prepared span replaced by its summary (yielded for, as L4 does),
    then L1 and L2; None when the preparation does not fit this view."""
    from ._pipeline import LAYERS, LayerOutcome  # (the pipeline imports this module)

    plan = _plan_at(view, interactions, prepared)
    if plan is None:
        return None
    text = yield plan.request
    if not isinstance(text, str) or not text.strip():
        return None
    kept = span_record(plan.middle, policy, view.counter.count_text)
    summarised = apply_summary(view, plan, text, kept.render())
    outcomes = [LayerOutcome("L4", view.total(), summarised.total(),
                             view.total() - summarised.total(), plan.request.message_count,
                             True, PREPARED_DETAIL)]
    current = summarised
    # Never L3: it would cut what the summary's verbatim tail is for.
    for layer in [layer for layer in LAYERS if layer.name in ("L1", "L2")]:
        cut, changed = layer.run(current, validate_tool_protocol(current.messages), policy)
        outcomes.append(LayerOutcome(layer.name, current.total(), cut.total(),
                                     current.total() - cut.total(), changed, changed > 0))
        current = cut
    if current.total() >= stop_below:
        return None
    return current, outcomes, plan.request
