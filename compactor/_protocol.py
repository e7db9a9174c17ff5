"""The tool-call protocol: every use answered by exactly one result, in the right place.

Everything in ``__all__`` gets re-exported.

Three kinds of pairs exist (see ``_blocks``):

* client calls — a ``tool_use`` in an assistant message, answered by a ``tool_result`` in the
  very next message, which must be a user message whose ``tool_result`` blocks come first;
* server calls — ``server_tool_use`` / ``mcp_tool_use`` and their ``*_tool_result`` inside one
  assistant message, the result after the use (a use may stand alone: ``pause_turn``);
* messages whose role is neither user nor assistant (``system`` messages real clients send)
  are transparent: "the next message" skips them.

The map this module returns is what lets the layers remove a pair atomically.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ._blocks import CLIENT_RESULT, CLIENT_USE, SERVER_USES, Message, blocks_of, is_server_result
from ._errors import MessageShapeError, ProtocolErrorKind, ToolProtocolError

__all__ = ["Interaction", "validate_tool_protocol"]

InteractionKind = Literal["client", "server"]


@dataclass(frozen=True)
class Interaction:
    """One tool call and where its answer is.

    Attributes:
        tool_use_id: the id shared by the use and its result.
        kind: ``client`` (result in the next user message) or ``server`` (result in the same
            assistant message).
        use_index: index in ``messages`` of the message holding the use.
        result_index: index of the message holding the result; None for a server use that
            has no result yet.
        name: the tool name of the use.
        tool_input: the use's ``input`` (the caller's object: read-only).
        is_error: whether the result says ``is_error: true``.
    """

    tool_use_id: str
    kind: InteractionKind
    use_index: int
    result_index: int | None
    name: str
    tool_input: Any
    is_error: bool


def check_shape(messages: object) -> list[Message]:
    """``messages``, checked to be a list of message objects with valid content.

    Raises:
        MessageShapeError: naming the first place that is not (``messages.3.content.1``).
    """
    if not isinstance(messages, list):
        raise MessageShapeError("messages", "must be a list")
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise MessageShapeError(f"messages.{index}", "must be an object")
        content = message.get("content")
        if isinstance(content, list):
            for position, block in enumerate(content):
                if not isinstance(block, dict):
                    raise MessageShapeError(f"messages.{index}.content.{position}",
                                            "must be an object")
        elif not isinstance(content, str):
            raise MessageShapeError(f"messages.{index}.content",
                                    "must be a string or a list of blocks")
    return messages


def _id_of(block: dict[str, Any], field: str, index: int) -> str:
    value = block.get(field)
    if not isinstance(value, str) or not value:
        raise MessageShapeError(f"messages.{index}", f"{block.get('type')} block has no {field}")
    return value


def validate_tool_protocol(messages: list[Message]) -> dict[str, Interaction]:
    """Check the tool-call protocol of ``messages`` and map every call to its answer.

    Returns:
        ``{tool_use_id: Interaction}`` in order of the uses.

    Raises:
        ToolProtocolError: with ``kind`` ``missing``, ``unknown``, ``duplicate``,
            ``out_of_order`` or ``not_adjacent``, the id and the message index.
        MessageShapeError: a message or block is not an object, or an id is absent (a
            ``ValueError``).
    """
    check_shape(messages)
    # One pre-scan of every use and result position, so a violation can be classified
    # (an unanswered use answered later is ``not_adjacent``, not ``missing``).
    use_at: dict[str, int] = {}
    results_at: dict[str, list[int]] = {}
    for index, message in enumerate(messages):
        for block in blocks_of(message):
            block_type = block.get("type")
            if block_type == CLIENT_USE or block_type in SERVER_USES:
                use_at.setdefault(_id_of(block, "id", index), index)
            elif block_type == CLIENT_RESULT:
                results_at.setdefault(_id_of(block, "tool_use_id", index), []).append(index)

    interactions: dict[str, Interaction] = {}
    open_uses: dict[str, dict[str, Any]] = {}  # client uses waiting for the next message
    open_from = -1
    seen_use_ids: set[str] = set()

    def close_open(at: int) -> None:
        for tool_use_id in open_uses:
            later = [i for i in results_at.get(tool_use_id, ()) if i > open_from]
            kind: ProtocolErrorKind = "not_adjacent" if later else "missing"
            raise ToolProtocolError(kind, tool_use_id, open_from,
                                    "tool_use has no tool_result in the next message")

    for index, message in enumerate(messages):
        role = message.get("role")
        if role not in ("user", "assistant"):
            continue  # transparent for adjacency
        blocks = blocks_of(message)
        answered_here: dict[str, tuple[dict[str, Any], bool]] = {}
        if role == "user":
            seen_other = False
            for block in blocks:
                if block.get("type") != CLIENT_RESULT:
                    seen_other = True
                    continue
                tool_use_id = block["tool_use_id"]
                if tool_use_id in answered_here or tool_use_id in interactions:
                    raise ToolProtocolError("duplicate", tool_use_id, index,
                                            "tool_use_id answered more than once")
                if tool_use_id not in open_uses:
                    use_index = use_at.get(tool_use_id)
                    if use_index is None:
                        raise ToolProtocolError("unknown", tool_use_id, index,
                                                "no tool_use carries this id")
                    if use_index > index:
                        raise ToolProtocolError("out_of_order", tool_use_id, index,
                                                "tool_result comes before its tool_use")
                    raise ToolProtocolError("not_adjacent", tool_use_id, index,
                                            "tool_result is not in the message right after "
                                            "its tool_use")
                if seen_other:
                    raise ToolProtocolError("out_of_order", tool_use_id, index,
                                            "tool_result blocks must come first in their message")
                answered_here[tool_use_id] = (block, block.get("is_error") is True)
            for tool_use_id, use in open_uses.items():
                if tool_use_id in answered_here:
                    interactions[tool_use_id] = Interaction(
                        tool_use_id, "client", open_from, index, str(use.get("name", "")),
                        use.get("input"), answered_here[tool_use_id][1])
            for tool_use_id in list(open_uses):
                if tool_use_id in answered_here:
                    del open_uses[tool_use_id]
            close_open(index)
            continue

        # role == "assistant"
        close_open(index)
        server_open: dict[str, dict[str, Any]] = {}
        for block in blocks:
            block_type = block.get("type")
            if block_type == CLIENT_USE or block_type in SERVER_USES:
                tool_use_id = block["id"]
                if tool_use_id in seen_use_ids:
                    raise ToolProtocolError("duplicate", tool_use_id, index,
                                            "tool_use id is used more than once")
                seen_use_ids.add(tool_use_id)
                if block_type == CLIENT_USE:
                    open_uses[tool_use_id] = block
                else:
                    server_open[tool_use_id] = block
            elif is_server_result(block_type):
                tool_use_id = _id_of(block, "tool_use_id", index)
                server_use = server_open.pop(tool_use_id, None)
                if server_use is None:
                    if tool_use_id in interactions:
                        raise ToolProtocolError("duplicate", tool_use_id, index,
                                                "server tool use answered more than once")
                    later = use_at.get(tool_use_id)
                    if later is not None and (later > index or tool_use_id not in seen_use_ids):
                        raise ToolProtocolError("out_of_order", tool_use_id, index,
                                                f"{block_type} comes before its use")
                    if later is not None:
                        raise ToolProtocolError("not_adjacent", tool_use_id, index,
                                                f"{block_type} is not in the message of its use")
                    raise ToolProtocolError("unknown", tool_use_id, index,
                                            "no server tool use carries this id")
                interactions[tool_use_id] = Interaction(
                    tool_use_id, "server", index, index, str(server_use.get("name", "")),
                    server_use.get("input"), block.get("is_error") is True)
            elif block_type == CLIENT_RESULT:
                raise ToolProtocolError("out_of_order", _id_of(block, "tool_use_id", index), index,
                                        "tool_result inside an assistant message")
        for tool_use_id, lone in server_open.items():
            # A server use without its result (a paused turn) stands alone as a unit.
            interactions[tool_use_id] = Interaction(
                tool_use_id, "server", index, None, str(lone.get("name", "")), lone.get("input"),
                False)
        open_from = index
    close_open(len(messages))
    return dict(sorted(interactions.items(), key=lambda item: item[1].use_index))
