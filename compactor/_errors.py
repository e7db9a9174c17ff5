"""The exceptions that end a compaction on purpose. Each carries data, never message text,
so the proxy can build its error body and its audit line from the fields alone.

:class:`MessageShapeError` and :class:`ToolProtocolError` are the client's mistakes (a 400);
any other exception out of the compactor is a bug in it.

Everything in ``__all__`` gets re-exported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from ._pipeline import LayerOutcome

__all__ = ["MessageShapeError", "ToolProtocolError", "MessageViewLimitExceeded",
           "ProtocolErrorKind"]


class MessageShapeError(ValueError):
    """``messages`` does not have the shape of the Messages API: not a list, a message or a
    block that is not an object, a content of the wrong type, a tool call without its id.

    A ``ValueError`` (what callers already catch), but its own class, so a caller can refuse the
    request for it alone and treat any other ``ValueError`` as the bug it is.

    Attributes:
        path: where, as a JSON path into the request (``messages.3.content.1``).
        problem: what is wrong there (``must be an object``); names types, never values.
    """

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")

ProtocolErrorKind = Literal["missing", "unknown", "duplicate", "out_of_order", "not_adjacent"]


class ToolProtocolError(ValueError):
    """The history breaks the tool-call protocol.

    Attributes:
        kind: ``missing`` (a ``tool_use`` never answered), ``unknown`` (a result whose id no
            earlier use carries), ``duplicate`` (an id used or answered twice),
            ``out_of_order`` (a result before its use, or not at the start of its message),
            ``not_adjacent`` (answered, but not in the message right after the use).
        tool_use_id: the offending id.
        message_index: the index in ``messages`` where the problem was found.
    """

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
    """The view is still at or above the hard limit after every layer that could run.

    Its text is exactly the provider's own ``prompt is too long: N tokens > M maximum`` (N the
    tokens after compaction, M the hard limit), which clients parse; the layers and the count
    before compaction are in the attributes, and ``outcomes`` says what each layer that ran
    on this request did (figures only), for the audit log.
    """

    def __init__(self, *, tokens_before: int, tokens_after: int, hard_limit: int,
                 layers_applied: tuple[str, ...],
                 outcomes: tuple[LayerOutcome, ...] = ()) -> None:
        self.tokens_before = tokens_before
        self.tokens_after = tokens_after
        self.hard_limit = hard_limit
        self.layers_applied = tuple(layers_applied)
        self.outcomes = tuple(outcomes)
        super().__init__(f"prompt is too long: {tokens_after} tokens > {hard_limit} maximum")
