"""What the fake upstream answers: scripted replies, their token counts, the ``Message`` JSON
and its SSE stream.

:mod:`.scripted` holds :class:`Reply`, :class:`Fault` and the block builders; :mod:`.tokens`
the deterministic token estimates, :class:`TokenRule` and the simulated :class:`PromptCache`;
:mod:`.message` the ``Message`` object and the SSE events that stream it (reference §7).
Every public name of these modules is importable from here.
"""

from .message import (
    JSON_FRAGMENTS,
    JSON_INPUT_TYPES,
    TEXT_FRAGMENTS,
    build_message,
    encode_event,
    stream_events,
)
from .scripted import (
    FAULT_KINDS,
    MALFORMED_SSE_EVENT,
    MALFORMED_SSE_TAIL,
    Fault,
    FaultKind,
    Reply,
    redacted_thinking_block,
    text_block,
    thinking_block,
    tool_use_block,
)
from .tokens import (
    CHARS_PER_TOKEN,
    PREFIX_CHUNK,
    PromptCache,
    PromptMeasure,
    TokenRule,
    Usage,
    canonical_prompt,
    estimate_tokens,
    output_tokens,
    without_cache_markers,
)

__all__ = [
    "CHARS_PER_TOKEN",
    "FAULT_KINDS",
    "JSON_FRAGMENTS",
    "JSON_INPUT_TYPES",
    "MALFORMED_SSE_EVENT",
    "MALFORMED_SSE_TAIL",
    "PREFIX_CHUNK",
    "TEXT_FRAGMENTS",
    "Fault",
    "FaultKind",
    "PromptCache",
    "PromptMeasure",
    "Reply",
    "TokenRule",
    "Usage",
    "build_message",
    "canonical_prompt",
    "encode_event",
    "estimate_tokens",
    "output_tokens",
    "redacted_thinking_block",
    "stream_events",
    "text_block",
    "thinking_block",
    "tool_use_block",
    "without_cache_markers",
]
