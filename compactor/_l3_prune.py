"""L3 — prune old messages, keeping the original intent and the recent turns.

Keeps every message up to and including the first user message (the original intent, kept
verbatim), every message whose role is neither user nor assistant, a summary L4 wrote, and
the most recent ``keep_recent_messages``; drops the rest. An interaction that crosses the
cut (its use dropped, its result kept) is removed whole, and a message left empty goes with
it.
"""

from __future__ import annotations

from ._blocks import DROPPABLE_ROLES, first_user_index
from ._l4_summary import is_summary_message
from ._protocol import Interaction
from ._view import View, drop_pairs, tidy

__all__: list[str] = []


def prune_old_messages(view: View, interactions: dict[str, Interaction],
                       keep_recent: int) -> tuple[View, int]:
    """L3: the view without the old middle, and how many messages were dropped."""
    messages = view.messages
    first = first_user_index(messages)
    if first is None:
        return view, 0
    # The last message is the turn being answered: it always stays.
    tail_start = max(first + 1, len(messages) - max(1, keep_recent))
    # A summary L4 wrote stands for everything before it: pruning it would lose that
    # history without a summary, so it stays like the first message.
    dropped = {i for i in range(first + 1, tail_start)
               if messages[i].get("role") in DROPPABLE_ROLES
               and not is_summary_message(messages[i])}
    if not dropped:
        return view, 0
    crossing = {
        tool_use_id for tool_use_id, it in interactions.items()
        if it.result_index is not None
        and (it.use_index in dropped) != (it.result_index in dropped)
    }
    kept = [m for i, m in enumerate(messages) if i not in dropped]
    pruned = drop_pairs(kept, crossing) if crossing else tidy(kept)
    return view.derive(pruned), len(dropped)
