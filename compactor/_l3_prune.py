"""L3 — prune old messages, keeping the original intent and the recent turns.

Also kept: other roles, L4's summaries, the turn in progress's opener and its answer
(``_turns``); the recent ``keep_recent_messages`` start on a whole exchange. An interaction
that still crosses the cut goes whole, and a message left empty with it.
"""

from __future__ import annotations

from collections.abc import Mapping

from policies import CompactionPolicy

from ._blocks import DROPPABLE_ROLES, Message, first_user_index
from ._l4_summary import (
    dropped_count,
    holds_summary,
    is_drop_record,
    recent_start,
    record_message,
)
from ._protocol import Interaction
from ._record import span_record
from ._turns import protected_indices, protected_opening
from ._view import View, drop_pairs, tidy


def _kept_anyway(view: View, interactions: Mapping[str, Interaction]) -> set[int]:
    """Messages L3 never drops besides the head and the tail."""
    messages = view.messages
    # A summary stands for everything before it, so it stays; an earlier L3 record does not
    # (its content is carried into the new record).
    summaries = {i for i, m in enumerate(messages) if holds_summary(m) and not is_drop_record(m)}
    answered = {it.use_index for it in interactions.values() if it.result_index in summaries}
    return set(protected_indices(messages)) | summaries | answered


def _record_place(messages: list[Message], dropped: set[int]) -> int:
    """Where the record of ``dropped`` goes: where the cut starts, but never inside the turn
    in progress (a user text there would end it): then just before its protected opener."""
    at = min(dropped)
    opening = protected_opening(messages)
    if opening is not None and at > opening[0]:
        at = opening[0]
    return at


def prune_old_messages(view: View, interactions: Mapping[str, Interaction],
                       policy: CompactionPolicy) -> tuple[View, int]:
    """L3: the view without the old middle (all but ``policy.keep_recent_messages``), and how
    many messages were dropped. What a person typed there and the files and commands of its
    tool calls stay, verbatim, in a record where the cut starts (``_record``)."""
    messages = view.messages
    first = first_user_index(messages)
    if first is None:
        return view, 0
    # The last message is the turn being answered: it always stays.
    tail_start = recent_start(messages, interactions, first, policy.keep_recent_messages)
    kept_anyway = _kept_anyway(view, interactions)
    dropped = {i for i in range(first + 1, tail_start)
               if messages[i].get("role") in DROPPABLE_ROLES and i not in kept_anyway}
    records = {i for i in dropped if is_drop_record(messages[i])}
    if not dropped or (dropped == records and len(records) == 1):
        return view, 0  # (a record alone is already what dropping it would leave)
    crossing = {
        tool_use_id for tool_use_id, it in interactions.items()
        if it.result_index is not None
        and (it.use_index in dropped) != (it.result_index in dropped)
    }
    kept = [m for i, m in enumerate(messages) if i not in dropped]
    record = span_record([messages[i] for i in sorted(dropped)], policy,
                         view.counter.count_text)
    if record:
        at = _record_place(messages, dropped)
        kept.insert(sum(1 for i in range(at) if i not in dropped),
                    record_message(record.render(), len(dropped - records)
                                   + sum(dropped_count(messages[i]) for i in records)))
    pruned = view.derive(drop_pairs(kept, crossing) if crossing else tidy(kept))
    if record and pruned.total() >= view.total():
        # The span was mostly what the record keeps: dropping it saves nothing.
        return view, 0
    return pruned, len(dropped)
