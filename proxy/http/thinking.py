"""The thinking-binding opt-out (reference section 5.4, SPEC section 2).

Newer models bind each thinking block's signature to its prefix, which compaction and the
durable block rewrite; such a request is opted into ``prefix_mismatch_behavior: drop_block``
(with its beta header) unless the client chose a behaviour itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

__all__ = ["BINDING_BETA", "needs_binding_opt_out", "apply_binding_opt_out", "merge_beta_header"]

#: The ``anthropic-beta`` value that enables ``thinking.block_binding``.
BINDING_BETA: Final = "thinking-binding-controls-2026-08-01"

_THINKING_ON: Final = frozenset({"enabled", "adaptive"})
_THINKING_BLOCKS: Final = frozenset({"thinking", "redacted_thinking"})


def needs_binding_opt_out(body: dict[str, Any], *, prefix_changed: bool) -> bool:
    """Whether to add ``thinking.block_binding``: thinking is on, the forwarded messages still
    hold thinking blocks, the proxy changed their prefix, and the client set no binding."""
    if not prefix_changed:
        return False
    thinking = body.get("thinking")
    if not isinstance(thinking, dict) or thinking.get("type") not in _THINKING_ON:
        return False
    if "block_binding" in thinking:
        return False
    return any(isinstance(block, dict) and block.get("type") in _THINKING_BLOCKS
               for message in body.get("messages") or ()
               if isinstance(message, dict) and isinstance(message.get("content"), list)
               for block in message["content"])


def apply_binding_opt_out(body: dict[str, Any]) -> None:
    """Set ``thinking.block_binding`` on ``body`` (in a new ``thinking`` object)."""
    body["thinking"] = {**body["thinking"],
                        "block_binding": {"prefix_mismatch_behavior": "drop_block"}}


def merge_beta_header(values: Iterable[str], beta: str = BINDING_BETA) -> str:
    """One ``anthropic-beta`` value: the existing values as sent, then ``beta`` if missing."""
    kept = [value for value in values if value.strip()]
    listed = {part.strip() for value in kept for part in value.split(",")}
    if beta in listed:
        return ",".join(kept)
    return ",".join([*kept, beta])
