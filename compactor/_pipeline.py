"""The pipeline: validate, then L1 → L2 → L3 → L4, cheapest first, stopping below the soft
threshold; reject at or above the hard limit.

The cheap layers are data (:data:`LAYERS`) run by one loop. L4 needs the outside world, so the
steps are one generator that *yields* a :class:`SummaryRequest` and is sent the text back (h11's
``NEED_DATA`` idea): the sync driver answers with a callable, the async one with an awaitable,
``count_tokens`` from a cache or with None. No I/O happens here.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from typing import Any, cast

from policies import CompactionPolicy

from ._errors import MessageViewLimitExceeded, ToolProtocolError
from ._facts import MessageFact
from ._floor import always_kept_tokens
from ._l1_truncate import truncate_tool_results
from ._l2_reads import drop_superseded_reads
from ._l3_prune import prune_old_messages
from ._l4_summary import (
    SummaryRequest,
    apply_summary,
    plan_summary,
    summary_cache_key,
    summary_view,
)
from ._prepared import PreparedSpan, use_prepared
from ._protocol import (
    Interaction,
    ProtocolMemo,
    StagedMemo,
    check_shape,
    validate_tool_protocol,
)
from ._record import span_record
from ._sticky import CompactionCheckpoint, policy_key, reuse_checkpoint
from ._thrash import THRASH_DEPTH, deeper, is_thrash
from ._tokens import CachingCounter, TokenCounter, as_caching
from ._view import View

__all__ = ["CompactionCheckpoint", "CompactionOptions", "CompactionResult", "LayerOutcome",
           "SummaryRequest", "compact_context", "compact_context_async", "compact_if_needed",
           "summary_cache_key", "summary_view"]

#: L4's model: the span as a JSON array in, the summary out (None, "" or raising: no summary).
Summarizer = Callable[[str], "str | None"]
#: The async driver's summariser gets the whole :class:`SummaryRequest`.
AsyncSummarizer = Callable[[SummaryRequest], "Awaitable[str | None]"]


@dataclass(frozen=True)
class Layer:
    """One cheap layer: ``run`` returns the new view and how many things it changed; one
    that ``reshapes`` (removes blocks or messages) has the interactions rebuilt after it."""

    name: str
    run: Callable[[View, dict[str, Interaction], CompactionPolicy], tuple[View, int]]
    reshapes: bool


#: The cheap layers, cheapest first. L4 follows them (see :func:`_summarise`).
LAYERS: tuple[Layer, ...] = (
    Layer("L1", truncate_tool_results, reshapes=False),
    Layer("L2", drop_superseded_reads, reshapes=True),
    Layer("L3", prune_old_messages, reshapes=True),
)


@dataclass(frozen=True)
class CompactionOptions:
    """How one call compacts, beyond its policy, summariser and counter (docs/library.md).

    Attributes:
        reserved_tokens: tokens outside ``messages`` that count toward the thresholds.
        sticky: reuse ``checkpoint`` while the history extends it; compact to
            ``soft × policy.compact_to_ratio``; return the checkpoint to keep.
        checkpoint: the session's checkpoint from its previous request, if any.
        copy: deep-copy the input first (the pipeline never mutates it either way).
        token_scale: the provider's tokens per counted token (calibration), applied to the
            thresholds' comparisons and the reported tokens.
        known_tokens: the provider's own count of messages, by fingerprint, used for them
            instead of counted × scale.
        facts: each message's :class:`MessageFact`, when the caller kept them.
        protocol_memo: tool-protocol walks kept across calls.
        prepared: a summary made ahead for this history, used first at a crossing.
    """

    reserved_tokens: int = 0
    sticky: bool = False
    checkpoint: CompactionCheckpoint | None = field(default=None, compare=False)
    copy: bool = True
    token_scale: float = 1.0
    known_tokens: Mapping[int, float] | None = field(default=None, compare=False)
    facts: Sequence[MessageFact | None] | None = field(default=None, compare=False, repr=False)
    protocol_memo: ProtocolMemo | StagedMemo | None = field(default=None, compare=False, repr=False)
    prepared: PreparedSpan | None = None

    def __post_init__(self) -> None:
        if not (self.token_scale > 0 and self.token_scale < float("inf")):
            raise ValueError(f"token_scale must be a positive number, got {self.token_scale!r}")


@dataclass(frozen=True)
class LayerOutcome:
    """What one layer did: the view's tokens before and after it, how many things it
    ``changed`` (results cut, reads, messages dropped or summarised), whether that change is
    ``applied`` in the final view, and a ``detail`` without message text."""

    layer: str
    tokens_before: int
    tokens_after: int
    saved: int
    changed: int
    applied: bool
    detail: str = ""


@dataclass(frozen=True)
class CompactionResult:
    """The compacted view and what it took.

    ``messages`` may share objects with the input and a checkpoint: treat it as read-only.
    Token figures include the reserved tokens and are scaled by ``token_scale``, except
    ``counted_after`` and ``message_tokens`` (the counter's own). ``checkpoint``: in sticky
    mode, the one to keep for the next request. ``thrash``: the soft threshold was crossed
    again soon after the last compaction, so this one went deeper.
    """

    messages: list[dict[str, Any]]
    durable_state: Any
    tokens_before: int
    tokens_after: int
    layers_applied: tuple[str, ...]
    outcomes: tuple[LayerOutcome, ...]
    summary_request: SummaryRequest | None = None
    checkpoint: CompactionCheckpoint | None = None
    reused_checkpoint: bool = False
    counted_after: int = 0
    fingerprints: tuple[int, ...] = field(default=(), repr=False)
    message_tokens: tuple[int, ...] = field(default=(), repr=False)
    thrash: bool = False

    @property
    def changed(self) -> bool:
        """True when the view differs from the input."""
        return bool(self.layers_applied)


def _json_copy(messages: Any) -> Any:
    try:
        return json.loads(json.dumps(messages))
    except (TypeError, ValueError):
        import copy

        return copy.deepcopy(messages)


Steps = Generator[SummaryRequest, "str | None", CompactionResult]


#: What the layers made: the view, each layer's outcome, the summary asked for (if any).
_Layered = tuple[View, list["LayerOutcome"], "SummaryRequest | None"]


def _layers(view: View, interactions: dict[str, Interaction], policy: CompactionPolicy,
            stop_below: int, summaries: bool, prepared: PreparedSpan | None = None, *,
            thrash: bool = False) -> Generator[SummaryRequest, str | None, _Layered]:
    """:data:`LAYERS` then L4 over ``view`` until it is below ``stop_below``; a
    ``prepared`` summary first. A ``thrash``ing session gets no new summary while the cheap
    layers keep it under the hard limit."""
    outcomes: list[LayerOutcome] = []
    stale = False
    entry = view
    before, before_interactions = view, interactions
    if prepared is not None and summaries and policy.summary_enabled:
        # Used first even where the cheap layers would do: it is paid for, and lands the
        # view as low as an inline summary (L1 to L3 land just below the target).
        served = yield from use_prepared(view, interactions, policy, stop_below, prepared)
        if served is not None:
            return served
    for layer in LAYERS:
        if view.total() < stop_below:
            return view, outcomes, None
        if stale:
            interactions = validate_tool_protocol(view.messages)
        before, before_interactions = view, interactions
        view, changed = layer.run(view, interactions, policy)
        outcomes.append(LayerOutcome(layer.name, before.total(), view.total(),
                                     before.total() - view.total(), changed, changed > 0))
        stale = layer.reshapes and changed > 0
    if (view.total() < stop_below or not (summaries and policy.summary_enabled)
            or (thrash and view.total() < policy.hard_limit_tokens)):
        return view, outcomes, None
    # L4 starts from the view L3 was given: what L3 dropped is summarised rather than lost.
    return (yield from _summarise(before, before_interactions, view, policy, outcomes, entry))


def _as_sent(request: SummaryRequest, base: View, entry: View) -> SummaryRequest:
    """``request`` with its conversation taken from ``entry`` (the view before the cheap
    layers: a prefix the provider has cached) up to the same kept message, when that cut is a
    whole exchange, so a forked summary reads the cache where L1 or L2 changed a message."""
    cut = len(request.conversation)
    if cut >= len(base.messages) or entry is base:
        return request
    boundary = base.messages[cut]
    index = next((i for i, m in enumerate(entry.messages) if m is boundary), None)
    if index is None or index <= cut:
        return request
    candidate = entry.messages[:index]
    try:
        validate_tool_protocol(candidate)
    except ToolProtocolError:
        return request
    return replace(request, conversation=tuple(candidate))


def _summarise(base: View, interactions: dict[str, Interaction], pruned: View,
               policy: CompactionPolicy, outcomes: list[LayerOutcome], entry: View,
               ) -> Generator[SummaryRequest, str | None, _Layered]:
    """L4: ``base`` with its old middle summarised, if that beats ``pruned`` (L3's view)."""

    def unchanged(detail: str) -> None:
        outcomes.append(LayerOutcome("L4", pruned.total(), pruned.total(), 0, 0, False, detail))

    if always_kept_tokens(base) >= policy.hard_limit_tokens:
        # A summary cannot help: none is paid for (_finish refuses the view).
        unchanged("no summary: what is always kept is over the hard limit")
        return pruned, outcomes, None
    plan = plan_summary(base, interactions, policy.summary_keep_recent)
    if plan is None:
        unchanged("nothing to summarise")
        return pruned, outcomes, None
    request = _as_sent(plan.request, base, entry)
    text = yield request
    if not isinstance(text, str) or not text.strip():
        unchanged("no summary: view kept")
        return pruned, outcomes, request
    kept = span_record(plan.middle, policy, base.counter.count_text)
    summarised = apply_summary(base, plan, text, kept.render())
    if summarised.total() >= pruned.total():
        unchanged("summary not smaller: view kept")
        return pruned, outcomes, request
    outcomes.append(LayerOutcome("L4", pruned.total(), summarised.total(),
                                 pruned.total() - summarised.total(),
                                 plan.request.message_count, True))
    l3 = outcomes[-2]
    if l3.layer == "L3" and l3.applied:
        outcomes[-2] = replace(l3, applied=False, detail="superseded by L4")
    return summarised, outcomes, request


def _steps(messages: list[dict[str, Any]], durable_state: Any, policy: CompactionPolicy,
           counter: TokenCounter | CachingCounter | None, options: CompactionOptions,
           summaries: bool) -> Steps:
    """The compaction of a copy of ``messages`` (unless told not to), yielding for summaries."""
    messages = _json_copy(messages) if options.copy else messages
    raw = _raw_view(messages, as_caching(counter), options)
    tokens_before = raw.total()
    soft = policy.soft_threshold_tokens
    key = policy_key(policy)
    checkpoint = options.checkpoint if options.sticky else None
    memo = options.protocol_memo
    reused = (None if checkpoint is None
              else reuse_checkpoint(checkpoint, raw, policy, key, memo))
    base_layers: tuple[str, ...] = ()
    if reused is not None:
        view, interactions, checkpoint = reused
        base_layers = checkpoint.layers
        if view.total() < soft:
            return _finish(view, durable_state, policy, tokens_before, base_layers, (), None,
                           checkpoint, reused=True)
    else:
        view = raw
        interactions = (validate_tool_protocol(messages) if memo is None
                        else memo.validate(messages, raw.fingerprints))
    # In sticky mode, compact deeper so that the next crossing is far away.
    stop_below = soft
    thrash = is_thrash(reused is not None and view.total() >= soft, checkpoint, len(messages))
    if options.sticky:
        stop_below = max(1, int(soft * policy.compact_to_ratio * (THRASH_DEPTH if thrash
                                                                   else 1.0)))
    outcomes: list[LayerOutcome] = []
    summary_request: SummaryRequest | None = None
    if view.total() >= soft:
        view, outcomes, summary_request = yield from _layers(
            view, interactions, deeper(policy) if thrash else policy, stop_below, summaries,
            options.prepared, thrash=thrash)
    layers = tuple(dict.fromkeys([*base_layers, *(o.layer for o in outcomes if o.applied)]))
    new_checkpoint = checkpoint if reused is not None else None
    if options.sticky and layers and view.messages is not messages:
        new_checkpoint = CompactionCheckpoint.build(messages, view.messages, key,
                                                    tuple(sorted(layers)), raw.fingerprints)
    result = _finish(view, durable_state, policy, tokens_before, layers, tuple(outcomes),
                     summary_request, new_checkpoint, reused=reused is not None)
    return replace(result, thrash=True) if thrash else result


def _raw_view(messages: list[dict[str, Any]], counter: CachingCounter,
              options: CompactionOptions) -> View:
    """The input as a view, from the caller's facts when it has all of them."""
    facts = options.facts
    if facts is not None and len(facts) != len(messages):
        raise ValueError(f"options.facts has {len(facts)} entries for {len(messages)} messages")
    if facts is None or not all(facts):  # (a fact is always true: no __eq__ per message)
        check_shape(messages)
        return View(messages, counter, options.reserved_tokens, scale=options.token_scale,
                    known=options.known_tokens)
    known = cast("Sequence[MessageFact]", facts)
    view = View(messages, counter, options.reserved_tokens, [f.fingerprint for f in known],
                [f.tokens for f in known], options.token_scale, options.known_tokens)
    view.marked = [i for i, f in enumerate(known) if f.marked]
    return view


def _finish(view: View, durable_state: Any, policy: CompactionPolicy, tokens_before: int,
            layers: tuple[str, ...], outcomes: tuple[LayerOutcome, ...],
            summary_request: SummaryRequest | None, checkpoint: CompactionCheckpoint | None,
            *, reused: bool) -> CompactionResult:
    tokens_after = view.total()
    if tokens_after >= policy.hard_limit_tokens:
        ran = tuple(dict.fromkeys([*layers, *(o.layer for o in outcomes)]))
        raise MessageViewLimitExceeded(tokens_before=tokens_before, tokens_after=tokens_after,
                                       hard_limit=policy.hard_limit_tokens,
                                       layers_applied=tuple(sorted(ran)), outcomes=outcomes)
    return CompactionResult(view.messages, durable_state, tokens_before, tokens_after,
                            tuple(sorted(layers)), outcomes, summary_request, checkpoint, reused,
                            view.counted(), tuple(view.fingerprints), tuple(view.tokens))


def _send(steps: Steps, text: str | None) -> SummaryRequest | CompactionResult:
    """``steps`` run on to the next summary request or to the result (a value:
    StopIteration cannot cross a future)."""
    try:
        return steps.send(text)
    except StopIteration as done:
        return cast(CompactionResult, done.value)


def compact_context(messages: list[dict[str, Any]], durable_state: Any = None, *,
                    policy: CompactionPolicy, summarizer: Summarizer | None = None,
                    counter: TokenCounter | CachingCounter | None = None,
                    options: CompactionOptions = CompactionOptions()) -> CompactionResult:
    """Compact ``messages`` (never mutated) until they are below the soft threshold.

    ``durable_state`` is returned untouched; ``summarizer`` is L4's model (None: no L4);
    ``counter`` defaults to 4 characters per token. Raises :class:`ToolProtocolError`,
    :class:`MessageViewLimitExceeded` or :class:`MessageShapeError` (docs/library.md).
    """
    steps = _steps(messages, durable_state, policy, counter, options, summarizer is not None)
    step = _send(steps, None)
    while isinstance(step, SummaryRequest):
        assert summarizer is not None
        try:
            text = summarizer(step.messages_json)
        except Exception:  # a failed summary never replaces history
            text = None
        step = _send(steps, text)
    return step


async def compact_context_async(
        messages: list[dict[str, Any]], durable_state: Any = None, *, policy: CompactionPolicy,
        summarizer: AsyncSummarizer | None = None,
        counter: TokenCounter | CachingCounter | None = None,
        options: CompactionOptions = CompactionOptions(),
        executor: Executor | None = None) -> CompactionResult:
    """:func:`compact_context` with an awaited summariser, given the whole
    :class:`SummaryRequest`. With ``executor``, the work between two summaries runs there
    (the event loop serves others meanwhile)."""
    steps = _steps(messages, durable_state, policy, counter, options, summarizer is not None)
    loop = asyncio.get_running_loop()
    text: str | None = None
    while True:
        if executor is None:
            step = _send(steps, text)
        else:
            step = await loop.run_in_executor(executor, _send, steps, text)
        if isinstance(step, CompactionResult):
            return step
        assert summarizer is not None
        try:
            text = await summarizer(step)
        except Exception:  # a failed summary never replaces history
            text = None


def compact_if_needed(messages: list[dict[str, Any]], durable_state: Any = None, *,
                      policy: CompactionPolicy, summarizer: Summarizer | None = None,
                      counter: TokenCounter | CachingCounter | None = None,
                      options: CompactionOptions = CompactionOptions()) -> list[dict[str, Any]]:
    """:func:`compact_context`, returning only the messages."""
    return compact_context(messages, durable_state, policy=policy, summarizer=summarizer,
                           counter=counter, options=options).messages
