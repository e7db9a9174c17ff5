"""Builders of request bodies and blocks for the rule tests (test_rules*.py): a body around
messages, user/assistant/system messages, and text, tool, thinking and server-tool blocks."""

from __future__ import annotations

from typing import Any

CC = {"type": "ephemeral"}


def body(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A request body around ``messages``."""
    return {"model": "claude-sonnet-4-5", "max_tokens": 1024, "messages": list(messages), **extra}


def user(*content: Any) -> dict[str, Any]:
    """A user message; a single string argument stays a string."""
    if len(content) == 1 and isinstance(content[0], str):
        return {"role": "user", "content": content[0]}
    return {"role": "user", "content": list(content)}


def assistant(*content: Any) -> dict[str, Any]:
    """An assistant message; a single string argument stays a string."""
    if len(content) == 1 and isinstance(content[0], str):
        return {"role": "assistant", "content": content[0]}
    return {"role": "assistant", "content": list(content)}


def system_msg(text: str) -> dict[str, Any]:
    """A 2026 role-``system`` message."""
    return {"role": "system", "content": text}


def text(value: str, **extra: Any) -> dict[str, Any]:
    return {"type": "text", "text": value, **extra}


def use(tool_id: str, name: str = "Read", **extra: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": name, "input": {"path": "a.py"}, **extra}


def result(tool_id: str, content: Any = "ok", **extra: Any) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tool_id, "content": content, **extra}


def thinking(value: str = "hmm", signature: str = "sig") -> dict[str, Any]:
    return {"type": "thinking", "thinking": value, "signature": signature}


def server_use(tool_id: str, kind: str = "server_tool_use") -> dict[str, Any]:
    return {"type": kind, "id": tool_id, "name": "web_search", "input": {"query": "q"}}


def server_result(tool_id: str, kind: str = "web_search_tool_result") -> dict[str, Any]:
    return {"type": kind, "tool_use_id": tool_id, "content": []}


TOOLS = [{"name": "Read", "input_schema": {"type": "object"}}]
