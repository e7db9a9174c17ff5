"""The pipeline: validate, then L1 → L2 → L3 → L4, cheapest first, stopping below the soft
threshold; reject at or above the hard limit.

Everything in ``__all__`` gets re-exported.

The steps are written once, as a generator that *yields* a :class:`SummaryRequest` when L4
needs a summary and is sent the text back (h11's ``NEED_DATA`` idea): the sync driver answers
with a plain callable, the async driver with an awaitable, and a driver that may not call a
model (``count_tokens``) answers from a cache or with None. No I/O happens here.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, Protocol

from ._errors import MessageViewLimitExceeded, ToolProtocolError
from ._l1_truncate import truncate_tool_results
from ._l2_reads import ReadTool, drop_superseded_reads
from ._l3_prune import prune_old_messages
from ._l4_summary import SummaryRequest, apply_summary, plan_summary
from ._markers import reapply_markers
from ._protocol import Interaction, check_shape, validate_tool_protocol
from ._sticky import CompactionCheckpoint, policy_key
from ._tokens import CachingCounter, TokenCounter
from ._view import View

__all__ = ["CompactionCheckpoint", "CompactionResult", "LayerOutcome", "SummaryRequest",
           "compact_context", "compact_context_async", "compact_if_needed"]


class PolicyLike(Protocol):
    """What the pipeline reads of ``policies.CompactionPolicy`` (read-only)."""

    @property
    def soft_threshold_tokens(self) -> int: ...
    @property
    def hard_limit_tokens(self) -> int: ...
    @property
    def max_tool_result_tokens(self) -> int: ...
    @property
    def keep_recent_messages(self) -> int: ...
    @property
    def summary_keep_recent(self) -> int: ...


@dataclass(frozen=True)
class LayerOutcome:
    """What one layer did.

    Attributes:
        layer: ``L1`` … ``L4``.
        tokens_before: tokens of the view when the layer started.
        tokens_after: tokens when it ended (equal to before when it changed nothing).
        saved: ``tokens_before - tokens_after``.
        changed: how many things it changed (results cut, reads or messages dropped,
            messages summarised).
        applied: whether its change is part of the final view (False when it changed
            nothing, failed, or a later layer superseded it).
        detail: a short note without message text (``summary failed: TimeoutError``).
    """

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

    Attributes:
        messages: the view to send. The caller's objects are never mutated; with
            ``copy=False`` unchanged messages (or, when nothing ran, the whole list) are the
            caller's own objects.
        durable_state: the durable state, exactly as given (it bypasses every layer).
        tokens_before: tokens of the input, reserved tokens included.
        tokens_after: tokens of the view.
        layers_applied: the layers whose change is in the view, in order.
        outcomes: one :class:`LayerOutcome` per layer that ran.
        summary_request: the span L4 asked to summarise, if it ran.
        checkpoint: in sticky mode, the checkpoint to keep for the session's next request
            (the one passed in when it was reused; None when nothing was compacted).
        reused_checkpoint: whether the view starts with a reused checkpoint's prefix.

    ``messages`` may share message objects with the input and with a checkpoint: treat it
    as read-only.
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


def _as_caching(counter: TokenCounter | CachingCounter | None) -> CachingCounter:
    return counter if isinstance(counter, CachingCounter) else CachingCounter(counter)


def _layers(view: View, interactions: dict[str, Any], policy: PolicyLike, stop_below: int,
            summaries: bool) -> Generator[SummaryRequest, str | None,
                                          tuple[View, list[LayerOutcome], SummaryRequest | None]]:
    """L1 → L4 over ``view``, cheapest first, until it is below ``stop_below``."""
    outcomes: list[LayerOutcome] = []

    def record(layer: str, before: View, after: View, changed: int) -> None:
        outcomes.append(LayerOutcome(layer, before.total(), after.total(),
                                     before.total() - after.total(), changed, changed > 0))

    def unchanged(layer: str, detail: str) -> None:
        outcomes.append(LayerOutcome(layer, view.total(), view.total(), 0, 0, False, detail))

    summary_request: SummaryRequest | None = None
    if view.total() >= stop_below:
        after, changed = truncate_tool_results(view, policy.max_tool_result_tokens)
        record("L1", view, after, changed)
        view = after
    if view.total() >= stop_below:
        read_tools: tuple[ReadTool, ...] = tuple(getattr(policy, "read_tools", ()))
        after, changed = drop_superseded_reads(view, interactions, read_tools)
        record("L2", view, after, changed)
        if changed:
            interactions = validate_tool_protocol(after.messages)
        view = after
    if view.total() < stop_below:
        return view, outcomes, None
    before_l3 = view
    after, changed = prune_old_messages(view, interactions, policy.keep_recent_messages)
    record("L3", view, after, changed)
    view = after
    if view.total() < stop_below or not (summaries and getattr(policy, "summary_enabled", True)):
        return view, outcomes, None
    # L4 starts again from the view before L3, so what L3 would have dropped is summarised
    # rather than lost.
    plan = plan_summary(before_l3, interactions, policy.summary_keep_recent)
    if plan is None:
        unchanged("L4", "nothing to summarise")
        return view, outcomes, None
    summary_request = plan.request
    text = yield plan.request
    if not isinstance(text, str) or not text.strip():
        unchanged("L4", "no summary: view kept")
        return view, outcomes, summary_request
    summarised = apply_summary(before_l3, plan, text)
    if summarised.total() >= view.total():
        unchanged("L4", "summary not smaller: view kept")
        return view, outcomes, summary_request
    outcomes.append(LayerOutcome("L4", view.total(), summarised.total(),
                                 view.total() - summarised.total(),
                                 plan.request.message_count, True))
    l3 = outcomes[-2]
    if l3.layer == "L3" and l3.applied:
        outcomes[-2] = LayerOutcome(l3.layer, l3.tokens_before, l3.tokens_after, l3.saved,
                                    l3.changed, False, "superseded by L4")
    return summarised, outcomes, summary_request


def _steps(messages: list[dict[str, Any]], durable_state: Any, policy: PolicyLike,
           counter: CachingCounter, reserved_tokens: int, summaries: bool,
           checkpoint: CompactionCheckpoint | None, sticky: bool,
           ) -> Generator[SummaryRequest, str | None, CompactionResult]:
    check_shape(messages)
    raw = View(messages, counter, reserved_tokens)
    tokens_before = raw.total()
    soft = policy.soft_threshold_tokens
    view, reused = raw, False
    base_layers: tuple[str, ...] = ()
    prints = raw.prints
    key = policy_key(policy)
    if (sticky and checkpoint is not None and checkpoint.policy_key == key
            and checkpoint.matches(messages, prints)):
        # A checkpoint read back from the store (a restart) matched by its stable digests:
        # give it this process's fingerprints, so later requests match by those alone.
        checkpoint = checkpoint.with_fingerprints(prints[: checkpoint.covered])
        # The history extends the checkpoint's: its compacted prefix, then the new messages
        # (with their oversized tool results cut, as L1 always would). The covered prefix
        # was validated when the checkpoint was made; the view the provider will get is
        # validated now, so a warm request does not re-walk the whole history.
        fresh, _ = truncate_tool_results(View(messages[checkpoint.covered:], counter),
                                         policy.max_tool_result_tokens)
        prefix = reapply_markers(checkpoint.view, checkpoint.view_prints, messages, prints,
                                 checkpoint.covered)
        view = raw.derive([*prefix, *fresh.messages])
        base_layers, reused = checkpoint.layers, True
        interactions = _validate_extension(view.messages, len(prefix), checkpoint.covered)
        if view.total() < soft:
            return _finish(view, durable_state, policy, tokens_before, base_layers, (), None,
                           checkpoint, reused=True)
    else:
        interactions = validate_tool_protocol(messages)
    # Crossing the soft threshold: compact. In sticky mode, clear enough at once that the
    # next crossing is far away.
    stop_below = soft
    if sticky:
        stop_below = max(1, int(soft * getattr(policy, "compact_to_ratio", 1.0)))
    outcomes: list[LayerOutcome] = []
    summary_request: SummaryRequest | None = None
    if view.total() >= soft:
        view, outcomes, summary_request = yield from _layers(view, interactions, policy,
                                                             stop_below, summaries)
    layers = tuple(dict.fromkeys([*base_layers, *(o.layer for o in outcomes if o.applied)]))
    new_checkpoint = checkpoint if reused else None
    if sticky and layers and view.messages is not messages:
        new_checkpoint = CompactionCheckpoint.build(messages, view.messages, key,
                                                    tuple(sorted(layers)), prints)
    return _finish(view, durable_state, policy, tokens_before, layers, tuple(outcomes),
                   summary_request, new_checkpoint, reused=reused)


def _validate_extension(view: list[dict[str, Any]], prefix_len: int,
                        covered: int) -> dict[str, Interaction]:
    """Validate a reused prefix plus new messages, naming errors by their index in the
    client's own history."""
    try:
        return validate_tool_protocol(view)
    except ToolProtocolError as error:
        index = error.message_index
        if index >= prefix_len:
            index = index - prefix_len + covered
        raise ToolProtocolError(error.kind, error.tool_use_id, index, error.detail) from None


def _finish(view: View, durable_state: Any, policy: PolicyLike, tokens_before: int,
            layers: tuple[str, ...], outcomes: tuple[LayerOutcome, ...],
            summary_request: SummaryRequest | None, checkpoint: CompactionCheckpoint | None,
            *, reused: bool) -> CompactionResult:
    tokens_after = view.total()
    if tokens_after >= policy.hard_limit_tokens:
        ran = tuple(dict.fromkeys([*layers, *(o.layer for o in outcomes)]))
        raise MessageViewLimitExceeded(tokens_before=tokens_before, tokens_after=tokens_after,
                                       hard_limit=policy.hard_limit_tokens,
                                       layers_applied=tuple(sorted(ran)))
    return CompactionResult(view.messages, durable_state, tokens_before, tokens_after,
                            tuple(sorted(layers)), outcomes, summary_request, checkpoint, reused)


def _drive_sync(steps: Generator[SummaryRequest, str | None, CompactionResult],
                answer: Callable[[SummaryRequest], str | None]) -> CompactionResult:
    try:
        request = next(steps)
        while True:
            request = steps.send(answer(request))
    except StopIteration as done:
        result: CompactionResult = done.value
        return result


def compact_context(messages: list[dict[str, Any]], durable_state: Any = None, *,
                    policy: PolicyLike,
                    summarizer: Callable[[str], str | None] | None = None,
                    counter: TokenCounter | CachingCounter | None = None,
                    reserved_tokens: int = 0, copy: bool = True,
                    checkpoint: CompactionCheckpoint | None = None,
                    sticky: bool = False) -> CompactionResult:
    """Compact ``messages`` until they are below the policy's soft threshold.

    Args:
        messages: the request's ``messages``; never mutated.
        durable_state: the session's ``DurableContextState``; returned untouched, never
            summarised (it is rendered into ``system`` by the caller).
        policy: a ``policies.CompactionPolicy``.
        summarizer: L4's model: takes the old messages as a JSON string, returns the summary
            text. An exception or an empty answer keeps the view as it was. None: no L4.
        counter: a token counter (default: 4 characters per token); pass one
            :class:`CachingCounter` across calls to count each block once.
        reserved_tokens: tokens outside ``messages`` (system, tools, durable block) that
            count toward the thresholds.
        copy: deep-copy the input first so the result shares nothing with it.
        sticky: reuse ``checkpoint`` while the history extends it, and return the
            checkpoint to keep in ``result.checkpoint`` (see :class:`CompactionCheckpoint`);
            a compaction then continues to ``soft × policy.compact_to_ratio``.
        checkpoint: the session's checkpoint from its previous request, if any.

    Raises:
        ToolProtocolError: the history breaks the tool-call protocol.
        MessageViewLimitExceeded: still at or above the hard limit after every layer.
        ValueError: a message or block is not an object.
    """
    source = _json_copy(messages) if copy else messages

    def answer(request: SummaryRequest) -> str | None:
        assert summarizer is not None
        try:
            return summarizer(request.messages_json)
        except Exception:  # a failed summary never replaces history
            return None

    steps = _steps(source, durable_state, policy, _as_caching(counter), reserved_tokens,
                   summarizer is not None, checkpoint, sticky)
    return _drive_sync(steps, answer)


async def compact_context_async(
        messages: list[dict[str, Any]], durable_state: Any = None, *, policy: PolicyLike,
        summarizer: Callable[[SummaryRequest], Awaitable[str | None]] | None = None,
        counter: TokenCounter | CachingCounter | None = None, reserved_tokens: int = 0,
        copy: bool = False, checkpoint: CompactionCheckpoint | None = None,
        sticky: bool = False) -> CompactionResult:
    """:func:`compact_context` for the proxy: the summariser is awaited.

    ``summarizer`` receives the whole :class:`SummaryRequest` (so it can cache by
    ``cache_key``); it should return None on failure (an exception is treated the same). The
    proxy owns the freshly parsed body, so ``copy`` defaults to False here: the pipeline
    itself never mutates its input.
    """
    source = _json_copy(messages) if copy else messages
    steps = _steps(source, durable_state, policy, _as_caching(counter), reserved_tokens,
                   summarizer is not None, checkpoint, sticky)
    try:
        request = next(steps)
        while True:
            assert summarizer is not None
            try:
                text = await summarizer(request)
            except Exception:
                text = None
            request = steps.send(text)
    except StopIteration as done:
        result: CompactionResult = done.value
        return result


def compact_if_needed(messages: list[dict[str, Any]], durable_state: Any = None, *,
                      policy: PolicyLike, summarizer: Callable[[str], str | None] | None = None,
                      counter: TokenCounter | CachingCounter | None = None,
                      reserved_tokens: int = 0) -> list[dict[str, Any]]:
    """:func:`compact_context`, returning only the messages."""
    return compact_context(messages, durable_state, policy=policy, summarizer=summarizer,
                           counter=counter, reserved_tokens=reserved_tokens).messages
