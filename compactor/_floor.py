"""The part of a view no layer removes (docs/how-it-works.md): when that alone is at or above
the hard limit, the pipeline refuses without asking for a summary.
"""

from __future__ import annotations

from ._blocks import DROPPABLE_ROLES, first_user_index
from ._turns import protected_indices
from ._view import View


def always_kept_tokens(view: View) -> int:
    """Tokens of the reserved part, the messages up to the first user message, other roles,
    the turn in progress's opening and the last message."""
    messages = view.messages
    if not messages:
        return view.total()
    first = first_user_index(messages)
    kept = set(range(0, (first if first is not None else -1) + 1))
    kept |= protected_indices(messages)
    kept.add(len(messages) - 1)
    kept |= {i for i, m in enumerate(messages) if m.get("role") not in DROPPABLE_ROLES}
    return view.derive([messages[i] for i in sorted(kept)]).total()
