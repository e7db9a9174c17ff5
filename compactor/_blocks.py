"""The rules about block types, as data, and small helpers to read blocks.

Every rule about which block types pair up, which ones L1 must never cut and which ones are
thinking lives here, so the layers never carry their own scattered ``if``s.
"""

from __future__ import annotations

from typing import Any

__all__: list[str] = []  # private helpers only

Message = dict[str, Any]
Block = dict[str, Any]

# A client tool call: answered by a ``tool_result`` in the next user message.
CLIENT_USE = "tool_use"
CLIENT_RESULT = "tool_result"

# Server-side tool calls: the use and its result live inside the same assistant message,
# the result after the use. Any ``*_tool_result`` type other than ``tool_result`` answers a
# server use (web_search_tool_result, code_execution_tool_result, mcp_tool_result, ...).
SERVER_USES = ("server_tool_use", "mcp_tool_use")

# Opaque, signed blocks: never edited, never cut.
THINKING = ("thinking", "redacted_thinking")

# Blocks L1 never cuts inside: binary payloads and structured results.
UNCUTTABLE = ("image", "document", "search_result", "tool_reference", "container_upload")

# The roles the compactor may drop. Any other role (``system`` messages real clients send, or a
# role added later) is never dropped.
DROPPABLE_ROLES = ("user", "assistant")


def is_server_result(block_type: object) -> bool:
    """True for the ``*_tool_result`` block types that answer a server-side use."""
    return (
        isinstance(block_type, str)
        and block_type != CLIENT_RESULT
        and block_type.endswith("_tool_result")
    )


def blocks_of(message: Message) -> list[Block]:
    """The message's content as a list of blocks (a string content is one text block).

    The returned list may be the message's own list: callers must not mutate it.
    """
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
    for index, message in enumerate(messages):
        if message.get("role") == "user":
            return index
    return None
