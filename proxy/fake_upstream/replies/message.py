"""The answer as the provider writes it: :func:`build_message` turns a :class:`.Reply` into the
provider's ``Message`` object, :func:`stream_events` into the exact event sequence of reference
§7 (``message_start``, ``ping``, ``content_block_start`` / ``content_block_delta`` … /
``content_block_stop`` per block, ``message_delta`` with cumulative usage, ``message_stop``),
and :func:`encode_event` puts one event on the wire.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from ..signatures import sign_thinking
from .scripted import Reply
from .tokens import Usage, output_tokens

# Blocks streamed through ``input_json_delta`` fragments; everything else that is not text or
# thinking arrives complete in its ``content_block_start`` (redacted thinking, server results,
# unknown types), as the provider does.
JSON_INPUT_TYPES: Final = ("tool_use", "server_tool_use", "mcp_tool_use")
TEXT_FRAGMENTS: Final = 3
JSON_FRAGMENTS: Final = 3


def _signed(block: Mapping[str, Any]) -> dict[str, Any]:
    """A reply block as served: a ``thinking`` block without a signature gets the fake's."""
    served = dict(block)
    if served.get("type") == "thinking" and served.get("signature") is None:
        served["signature"] = sign_thinking(str(served.get("thinking", "")))
    return served



# -- the Message and its stream ------------------------------------------------------------------


def build_message(reply: Reply, *, message_id: str, model: str, usage: Usage) -> dict[str, Any]:
    """The ``Message`` JSON the provider would return for ``reply``."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [_signed(block) for block in reply.content],
        "stop_reason": reply.stop_reason,
        "stop_sequence": reply.stop_sequence,
        "usage": {
            **usage.as_dict(),
            "output_tokens": output_tokens(reply.content),
            "service_tier": "standard",
        },
    }


def _fragments(text: str, parts: int) -> list[str]:
    """``text`` cut into up to ``parts`` non-empty consecutive pieces (one piece if short)."""
    if not text:
        return [""]
    size = max(1, -(-len(text) // parts))
    return [text[i:i + size] for i in range(0, len(text), size)]


def _block_events(index: int, block: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    block_type = block["type"]
    events: list[tuple[str, dict[str, Any]]] = []

    def start(content_block: Mapping[str, Any]) -> None:
        events.append(("content_block_start", {
            "type": "content_block_start", "index": index, "content_block": dict(content_block),
        }))

    def delta(payload: dict[str, Any]) -> None:
        events.append(("content_block_delta", {
            "type": "content_block_delta", "index": index, "delta": payload,
        }))

    if block_type == "text":
        start({**block, "text": ""})
        for piece in _fragments(str(block.get("text", "")), TEXT_FRAGMENTS):
            delta({"type": "text_delta", "text": piece})
    elif block_type == "thinking":
        start({"type": "thinking", "thinking": "", "signature": ""})
        for piece in _fragments(str(block.get("thinking", "")), TEXT_FRAGMENTS):
            delta({"type": "thinking_delta", "thinking": piece})
        delta({"type": "signature_delta", "signature": str(block.get("signature", ""))})
    elif block_type in JSON_INPUT_TYPES:
        start({**block, "input": {}})
        # The provider's first fragment is often empty; clients must concatenate regardless.
        delta({"type": "input_json_delta", "partial_json": ""})
        encoded = json.dumps(block.get("input", {}), ensure_ascii=False)
        for piece in _fragments(encoded, JSON_FRAGMENTS):
            delta({"type": "input_json_delta", "partial_json": piece})
    else:
        start(block)
    events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    return events


def stream_events(message: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The SSE events, as ``(event name, data)``, that stream ``message`` (reference §7)."""
    usage = dict(message["usage"])
    start_usage = {key: usage[key] for key in (
        "input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens",
    )}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": {
            **message,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**start_usage, "output_tokens": 1, "service_tier": "standard"},
        }}),
        ("ping", {"type": "ping"}),
    ]
    for index, block in enumerate(message["content"]):
        events.extend(_block_events(index, block))
    events.append(("message_delta", {
        "type": "message_delta",
        "delta": {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]},
        "usage": {**start_usage, "output_tokens": usage["output_tokens"]},
    }))
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def encode_event(name: str, data: Mapping[str, Any]) -> bytes:
    """One SSE event on the wire: ``event: <name>\\ndata: <json>\\n\\n``."""
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {name}\ndata: {payload}\n\n".encode()
