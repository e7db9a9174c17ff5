"""The rules about block types, as data (which pair up, which L1 never cuts, which are
thinking), and small helpers to read blocks."""

from __future__ import annotations

from typing import Any

Message = dict[str, Any]
Block = dict[str, Any]

# A client tool call: answered by a ``tool_result`` in the next user message.
CLIENT_USE = "tool_use"
CLIENT_RESULT = "tool_result"

# Server-side tool calls: the use, then its result (any other ``*_tool_result`` type), in the
# same assistant message.
SERVER_USES = ("server_tool_use", "mcp_tool_use")

# Opaque, signed blocks: never edited, never cut.
THINKING = ("thinking", "redacted_thinking")

# Blocks L1 never cuts inside: binary payloads and structured results.
UNCUTTABLE = ("image", "document", "search_result", "tool_reference", "container_upload")

# The roles the compactor may drop; any other (``system`` messages) is never dropped.
DROPPABLE_ROLES = ("user", "assistant")


def is_server_result(block_type: object) -> bool:
    """True for the ``*_tool_result`` block types that answer a server-side use."""
    return (
        isinstance(block_type, str)
        and block_type != CLIENT_RESULT
        and block_type.endswith("_tool_result")
    )


def blocks_of(message: Message) -> list[Block]:
    """The message's content as a list of blocks (a string is one text block); may be the
    message's own list: do not mutate it."""
    content = message.get("content")
    if isinstance(content, list):
        return content
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return []


def is_empty_content(message: Message) -> bool:
    """True when the message has no content the provider would accept."""
    content = message.get("content")
    if isinstance(content, str):
        return not content.strip()
    if isinstance(content, list):
        return len(content) == 0
    return True


def first_user_index(messages: list[Message]) -> int | None:
    """Index of the first message with role ``user`` (the original intent), or None."""
    return next((i for i, message in enumerate(messages) if message.get("role") == "user"), None)
