"""What a test scripts the fake to answer: a :class:`Reply` (content blocks, stop reason, or an
error, plus optional timing and a :class:`Fault` to inject) and the builders of its blocks.

Thinking the fake produces is signed the fake's way (:mod:`..signatures`): a ``thinking`` block
without a ``signature`` gets ``fakesig.…`` (:func:`thinking_block`, and :mod:`.message` when it
serves a block without one), so a client that sends it back unchanged passes the "cannot be
modified" rule and one that edits it does not; :func:`redacted_thinking_block` makes a
verifiable ``redacted_thinking``. Explicit signatures are served as given (opaque).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from ..signatures import redacted_data, sign_thinking

FaultKind = Literal["cut_after_events", "hang_before_first_byte", "close_connection", "error_event",
                    "slow_first_byte", "malformed_sse", "cut_mid_event"]
FAULT_KINDS: Final[tuple[FaultKind, ...]] = (
    "cut_after_events",
    "hang_before_first_byte",
    "close_connection",
    "error_event",
    "slow_first_byte",
    "malformed_sse",
    "cut_mid_event",
)
#: What ``malformed_sse`` sends after its valid events: a ``data`` line that is not JSON, then
#: bytes that are not SSE at all (no field name, not UTF-8, no terminating blank line).
MALFORMED_SSE_EVENT: Final = (
    b'event: content_block_delta\ndata: {"type": "content_block_delta", <<not json\n\n'
)
MALFORMED_SSE_TAIL: Final = b"\x00\xff\xfe garbage that is not an SSE field"


@dataclass(frozen=True)
class Fault:
    """A misbehaviour to inject while serving one reply.

    Kinds:
        ``cut_after_events``: stream ``after_events`` SSE events, then drop the connection
            without ``message_stop`` (non-streaming: send half the JSON body, then drop).
        ``hang_before_first_byte``: wait ``hang_s`` seconds before sending anything.
        ``close_connection``: close the connection without any response.
        ``error_event``: stream ``after_events`` events, then an ``event: error`` carrying
            ``error`` (default ``overloaded_error``), then end the stream normally.
        ``slow_first_byte``: wait ``hang_s`` seconds, then answer normally.
        ``malformed_sse``: stream ``after_events`` events, then :data:`MALFORMED_SSE_EVENT`
            and :data:`MALFORMED_SSE_TAIL`, then end the stream normally (no
            ``message_stop``); a non-streaming request gets a body that is not JSON.
        ``cut_mid_event``: stream ``after_events`` events, then the first half of the next
            one's bytes, then drop the connection (non-streaming: as ``cut_after_events``).
    """

    kind: FaultKind
    after_events: int = 0
    hang_s: float = 3600.0
    error: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"Fault.kind must be one of {FAULT_KINDS}, got {self.kind!r}")
        if self.after_events < 0:
            raise ValueError(f"Fault.after_events must be >= 0, got {self.after_events}")
        if self.hang_s < 0:
            raise ValueError(f"Fault.hang_s must be >= 0, got {self.hang_s}")

    def error_payload(self) -> dict[str, Any]:
        """The ``data`` of the ``error`` event this fault sends."""
        error = dict(self.error) if self.error is not None else {
            "type": "overloaded_error",
            "message": "Overloaded",
        }
        return {"type": "error", "error": error}


@dataclass(frozen=True)
class Reply:
    """One scripted answer of the fake upstream.

    Attributes:
        content: the assistant content blocks (dicts as the provider returns them).
        stop_reason: ``end_turn``, ``tool_use``, ``max_tokens``, ….
        stop_sequence: the matched stop sequence, usually ``None``.
        status: the HTTP status (200 for a message; the error status when ``error`` is set).
        headers: extra response headers (e.g. ``retry-after``).
        error: when set, the answer is this Anthropic error body (``{"type": "error",
            "error": {...}}``) with ``status``; ``request_id`` is added by the server.
        event_delay_s: pause between two SSE events (streaming only), to prove per-event relay.
        fault: an optional :class:`Fault` to inject.
    """

    content: Sequence[Mapping[str, Any]] = ()
    stop_reason: str = "end_turn"
    stop_sequence: str | None = None
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    error: Mapping[str, Any] | None = None
    event_delay_s: float = 0.0
    fault: Fault | None = None

    def __post_init__(self) -> None:
        blocks = tuple(self.content)
        for k, block in enumerate(blocks):
            if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
                raise ValueError(f"Reply.content[{k}] must be a block mapping with a 'type'")
        object.__setattr__(self, "content", blocks)
        object.__setattr__(self, "headers", dict(self.headers))
        if not 100 <= self.status <= 599:
            raise ValueError(f"Reply.status must be an HTTP status, got {self.status}")
        if self.error is not None and self.status < 400:
            raise ValueError(f"Reply.status must be >= 400 with an error, got {self.status}")
        if self.error is None and self.status >= 400:
            raise ValueError("Reply.error is required when Reply.status >= 400")
        if self.event_delay_s < 0:
            raise ValueError(f"Reply.event_delay_s must be >= 0, got {self.event_delay_s}")

    @classmethod
    def text(cls, text: str, **options: Any) -> Reply:
        """A reply holding one text block."""
        return cls(content=(text_block(text),), **options)

    @classmethod
    def tool_call(
        cls,
        name: str,
        tool_input: Mapping[str, Any],
        *,
        tool_use_id: str,
        text: str | None = None,
        **options: Any,
    ) -> Reply:
        """A reply asking for one client tool call (optionally after a text block)."""
        blocks: list[Mapping[str, Any]] = [] if text is None else [text_block(text)]
        blocks.append(tool_use_block(tool_use_id, name, tool_input))
        return cls(content=tuple(blocks), stop_reason="tool_use", **options)

    @classmethod
    def api_error(
        cls, status: int, error_type: str, message: str, *, headers: Mapping[str, str] | None = None
    ) -> Reply:
        """A reply that answers with the Anthropic error shape and ``status``."""
        return cls(
            status=status,
            error={"type": "error", "error": {"type": error_type, "message": message}},
            headers=dict(headers or {}),
        )


def text_block(text: str) -> dict[str, Any]:
    """A ``text`` content block."""
    return {"type": "text", "text": text}


def thinking_block(thinking: str, signature: str | None = None) -> dict[str, Any]:
    """A ``thinking`` content block; without ``signature`` the fake signs it itself
    (``fakesig.…``, verified when it comes back), with one it is served as given (opaque)."""
    if signature is None:
        signature = sign_thinking(thinking)
    return {"type": "thinking", "thinking": thinking, "signature": signature}


def redacted_thinking_block(payload: str) -> dict[str, Any]:
    """A ``redacted_thinking`` block whose ``data`` the fake can verify when it comes back."""
    return {"type": "redacted_thinking", "data": redacted_data(payload)}


def tool_use_block(tool_use_id: str, name: str, tool_input: Mapping[str, Any]) -> dict[str, Any]:
    """A client ``tool_use`` content block."""
    return {"type": "tool_use", "id": tool_use_id, "name": name, "input": dict(tool_input)}
