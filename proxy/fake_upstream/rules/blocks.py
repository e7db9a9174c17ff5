"""The rules of one message's blocks: a block's type, non-empty text, the shape of client and
server tool uses and results, thinking blocks' fields, and where thinking may sit in an
assistant message (first, never last). Unknown block types pass untouched.

Server-side tool pairs never cross a message: a ``*_tool_result`` must find its
``server_tool_use`` / ``mcp_tool_use`` earlier in the same assistant message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .texts import (
    CLIENT_RESULT_TYPE,
    CLIENT_USE_TYPE,
    MSG_DUPLICATE_ID,
    MSG_DUPLICATE_SERVER_RESULT,
    MSG_ID_PATTERN,
    MSG_ORPHAN_SERVER_RESULT,
    MSG_SIGNATURE,
    MSG_TEXT_EMPTY,
    MSG_TEXT_WHITESPACE,
    MSG_THINKING_FIRST,
    MSG_THINKING_LAST,
    SERVER_USE_FOR_RESULT,
    SERVER_USE_TYPES,
    THINKING_TYPES,
    TOOL_ID_PATTERN,
    _fail,
)


def _block_type(n: int, m: int, block: object) -> str:
    if not isinstance(block, Mapping):
        raise _fail(f"messages.{n}.content.{m}: Input should be a valid dictionary")
    block_type = block.get("type")
    if not isinstance(block_type, str) or not block_type:
        raise _fail(f"messages.{n}.content.{m}.type: Field required")
    return block_type


def _check_text(n: int, m: int, block: Mapping[str, Any], path: str = "") -> None:
    text = block.get("text")
    if not isinstance(text, str):
        raise _fail(f"messages.{n}.content.{m}{path}.text: Input should be a valid string")
    if not text:
        raise _fail(MSG_TEXT_EMPTY)
    if not text.strip():
        raise _fail(MSG_TEXT_WHITESPACE)


def _check_plain_blocks(n: int, content: object, role: str) -> None:
    """Blocks of a role-``system`` message: shape and text rules, no tool blocks at all."""
    if not isinstance(content, list):
        return
    for m, block in enumerate(content):
        block_type = _block_type(n, m, block)
        assert isinstance(block, Mapping)
        if block_type == "text":
            _check_text(n, m, block)
        elif block_type in (CLIENT_USE_TYPE, CLIENT_RESULT_TYPE, *SERVER_USE_TYPES):
            raise _fail(
                f"messages.{n}.content.{m}: `{block_type}` blocks are not allowed in a "
                f"`{role}` message"
            )


def _check_blocks(
    n: int, blocks: Sequence[object], role: str, seen_ids: set[str]
) -> list[str]:
    """Per-block rules of a user/assistant message; returns its ``tool_use`` ids in order."""
    uses: list[str] = []
    # Server/MCP use ids met so far in this message, mapped to "already answered".
    server_uses: dict[str, bool] = {}
    thinking_at: list[int] = []

    for m, block in enumerate(blocks):
        block_type = _block_type(n, m, block)
        assert isinstance(block, Mapping)
        if block_type == "text":
            _check_text(n, m, block)
        elif block_type == CLIENT_USE_TYPE or block_type in SERVER_USE_TYPES:
            if role != "assistant":
                raise _fail(
                    f"messages.{n}.content.{m}: `{block_type}` blocks can only be in "
                    f"`assistant` messages"
                )
            tool_id = _check_use(n, m, block, block_type, seen_ids)
            if block_type == CLIENT_USE_TYPE:
                uses.append(tool_id)
            else:
                server_uses[tool_id] = False
        elif block_type == CLIENT_RESULT_TYPE:
            if role != "user":
                raise _fail(
                    f"messages.{n}.content.{m}: `tool_result` blocks can only be in `user` "
                    f"messages"
                )
            _check_result_shape(n, m, block)
        elif block_type.endswith("_tool_result"):
            _check_server_result(n, m, block, block_type, server_uses)
        elif block_type in THINKING_TYPES:
            _check_thinking_shape(n, m, block, block_type)
            thinking_at.append(m)

    if role == "assistant" and thinking_at:
        first_type = _block_type(n, 0, blocks[0])
        if first_type not in THINKING_TYPES:
            raise _fail(MSG_THINKING_FIRST.format(n=n, found=first_type))
        last_type = _block_type(n, len(blocks) - 1, blocks[-1])
        # Not even a final assistant message (a prefill) may stop on its thinking.
        if last_type in THINKING_TYPES:
            raise _fail(MSG_THINKING_LAST.format(n=n, kind=last_type))
    return uses



def _check_use(
    n: int, m: int, block: Mapping[str, Any], block_type: str, seen_ids: set[str]
) -> str:
    tool_id = block.get("id")
    if not isinstance(tool_id, str):
        raise _fail(f"messages.{n}.content.{m}.{block_type}.id: Field required")
    if not TOOL_ID_PATTERN.match(tool_id):
        raise _fail(MSG_ID_PATTERN.format(n=n, m=m, kind=block_type))
    if tool_id in seen_ids:
        raise _fail(MSG_DUPLICATE_ID.format(n=n, m=m))
    seen_ids.add(tool_id)
    if not isinstance(block.get("name"), str) or not block.get("name"):
        raise _fail(f"messages.{n}.content.{m}.{block_type}.name: Field required")
    if "input" in block and not isinstance(block["input"], Mapping):
        raise _fail(
            f"messages.{n}.content.{m}.{block_type}.input: Input should be a valid dictionary"
        )
    return tool_id


def _check_result_shape(n: int, m: int, block: Mapping[str, Any]) -> None:
    if not isinstance(block.get("tool_use_id"), str):
        raise _fail(f"messages.{n}.content.{m}.tool_result.tool_use_id: Field required")
    content = block.get("content")
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise _fail(
            f"messages.{n}.content.{m}.tool_result.content: Input should be a valid string or list"
        )
    for k, inner in enumerate(content):
        if not isinstance(inner, Mapping) or not isinstance(inner.get("type"), str):
            raise _fail(f"messages.{n}.content.{m}.tool_result.content.{k}.type: Field required")
        if inner["type"] == "text":
            _check_text(n, m, inner, path=f".tool_result.content.{k}")


def _check_server_result(
    n: int, m: int, block: Mapping[str, Any], block_type: str, server_uses: dict[str, bool]
) -> None:
    use_type = SERVER_USE_FOR_RESULT.get(block_type, "server_tool_use")
    tool_id = block.get("tool_use_id")
    if not isinstance(tool_id, str):
        raise _fail(f"messages.{n}.content.{m}.{block_type}.tool_use_id: Field required")
    if tool_id not in server_uses:
        raise _fail(MSG_ORPHAN_SERVER_RESULT.format(n=n, m=m, kind=block_type, ids=tool_id,
                                                    use=use_type))
    if server_uses[tool_id]:
        raise _fail(MSG_DUPLICATE_SERVER_RESULT.format(n=n, m=m, kind=block_type, ids=tool_id,
                                                       use=use_type))
    server_uses[tool_id] = True


def _check_thinking_shape(n: int, m: int, block: Mapping[str, Any], block_type: str) -> None:
    if block_type == "thinking":
        if not isinstance(block.get("thinking"), str):
            raise _fail(f"messages.{n}.content.{m}.thinking.thinking: Field required")
        if "signature" not in block:
            raise _fail(f"messages.{n}.content.{m}.thinking.signature: Field required")
        signature = block["signature"]
        if not isinstance(signature, str) or not signature:
            raise _fail(MSG_SIGNATURE.format(n=n, m=m))
    elif not isinstance(block.get("data"), str) or not block.get("data"):
        raise _fail(f"messages.{n}.content.{m}.redacted_thinking.data: Field required")
