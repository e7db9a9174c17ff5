"""Small constructors for Messages API histories used by the compactor tests."""

from __future__ import annotations

from typing import Any

Message = dict[str, Any]


def user(*blocks: Any) -> Message:
    """A user message; a single string argument becomes string content."""
    if len(blocks) == 1 and isinstance(blocks[0], str):
        return {"role": "user", "content": blocks[0]}
    return {"role": "user", "content": [text(b) if isinstance(b, str) else b for b in blocks]}


def assistant(*blocks: Any) -> Message:
    """An assistant message of the given blocks (strings become text blocks)."""
    return {"role": "assistant", "content": [text(b) if isinstance(b, str) else b for b in blocks]}


def system_message(content: str) -> Message:
    """A role-``system`` message inside ``messages``, as newer clients send."""
    return {"role": "system", "content": content}


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_use(tool_id: str, name: str = "Bash", **tool_input: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": name, "input": tool_input}


def tool_result(tool_id: str, content: Any = "ok", *, is_error: bool = False) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_id, "content": content}
    if is_error:
        block["is_error"] = True
    return block


def thinking(value: str = "Let me think.", signature: str = "sig-abc") -> dict[str, Any]:
    return {"type": "thinking", "thinking": value, "signature": signature}


def server_pair(tool_id: str) -> list[dict[str, Any]]:
    return [
        {"type": "server_tool_use", "id": tool_id, "name": "web_search", "input": {"query": "q"}},
        {"type": "web_search_tool_result", "tool_use_id": tool_id,
         "content": [{"type": "web_search_result", "url": "https://example.org", "title": "t",
                      "encrypted_content": "Eo8B"}]},
    ]


def read_call(tool_id: str, path: str, **extra: Any) -> dict[str, Any]:
    return tool_use(tool_id, "Read", file_path=path, **extra)


def exchange(tool_id: str, result: Any = "ok", *, name: str = "Bash", lead: str = "Running it.",
             **tool_input: Any) -> list[Message]:
    """An assistant tool call and the user message answering it."""
    return [assistant(lead, tool_use(tool_id, name, **tool_input)),
            user(tool_result(tool_id, result))]


def long_session(turns: int, result_chars: int = 2_000) -> list[Message]:
    """A first user message, then ``turns`` tool exchanges, then a closing user question."""
    messages: list[Message] = [user("Please fix the failing test in tests/test_app.py")]
    for n in range(turns):
        messages += exchange(f"toolu_{n:04d}", f"output line {n}\n" * (result_chars // 14),
                             command=f"pytest -k case{n}")
    messages[-1]["content"].append(text("What next?"))
    return messages
