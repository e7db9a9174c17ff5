"""The part of a view no layer removes: what a compaction can never get below.

The reserved tokens (system, tools, durable block), everything up to the first user message
(the original intent), role-``system`` messages, the protected opening of the turn in progress
(``_turns``) and the last message (the turn being answered). When that alone is at or above
the hard limit, no summary can help: the pipeline refuses without asking for one.
"""

from __future__ import annotations

from ._blocks import DROPPABLE_ROLES, first_user_index
from ._turns import protected_indices
from ._view import View

__all__: list[str] = []


def always_kept_tokens(view: View) -> int:
    """Tokens of ``view``'s part that every layer keeps (see the module docstring)."""
    messages = view.messages
    if not messages:
        return view.total()
    first = first_user_index(messages)
    kept = set(range(0, (first if first is not None else -1) + 1))
    kept |= protected_indices(messages)
    kept.add(len(messages) - 1)
    kept |= {i for i, m in enumerate(messages) if m.get("role") not in DROPPABLE_ROLES}
    return view.derive([messages[i] for i in sorted(kept)]).total()
