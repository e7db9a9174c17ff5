"""The exceptions that end a compaction on purpose. Each carries data, never message text, so the
proxy builds its error body and audit line from the fields; :class:`MessageShapeError` and
:class:`ToolProtocolError` are the client's mistakes (a 400), any other exception a bug.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from ._pipeline import LayerOutcome

__all__ = ["MessageShapeError", "ToolProtocolError", "MessageViewLimitExceeded",
           "ProtocolErrorKind"]


class MessageShapeError(ValueError):
    """``messages`` does not have the shape of the Messages API: at ``path``
    (``messages.3.content.1``), the ``problem`` (types, never values). A ``ValueError`` of its
    own class, so a caller refuses the request for it alone."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


ProtocolErrorKind = Literal["missing", "unknown", "duplicate", "out_of_order", "not_adjacent"]


class ToolProtocolError(ValueError):
    """The history breaks the tool-call protocol: ``kind`` (``missing``, ``unknown``,
    ``duplicate``, ``out_of_order`` or ``not_adjacent``), the ``tool_use_id`` and the
    ``message_index`` where it was found."""

    def __init__(self, kind: ProtocolErrorKind, tool_use_id: str, message_index: int,
                 detail: str = "") -> None:
        self.kind: ProtocolErrorKind = kind
        self.tool_use_id = tool_use_id
        self.message_index = message_index
        self.detail = detail
        text = (f"tool protocol violation ({kind}) for tool_use_id {tool_use_id!r} "
                f"at messages.{message_index}")
        if detail:
            text += f": {detail}"
        super().__init__(text)


class MessageViewLimitExceeded(Exception):
    """The view is still at or above the hard limit after every layer that could run. Its
    text is the provider's own ``prompt is too long: N tokens > M maximum``, which clients
    parse; ``outcomes`` (figures only) are for the audit log."""

    def __init__(self, *, tokens_before: int, tokens_after: int, hard_limit: int,
                 layers_applied: tuple[str, ...],
                 outcomes: tuple[LayerOutcome, ...] = ()) -> None:
        self.tokens_before = tokens_before
        self.tokens_after = tokens_after
        self.hard_limit = hard_limit
        self.layers_applied = tuple(layers_applied)
        self.outcomes = tuple(outcomes)
        super().__init__(f"prompt is too long: {tokens_after} tokens > {hard_limit} maximum")
