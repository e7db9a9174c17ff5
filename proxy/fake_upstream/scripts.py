"""The fake upstream's default behaviour: a short deterministic answer, or a structured summary
when the request comes from the proxy's summarizer.

A *script* is any callable ``(body, request_meta) -> Reply`` (or an awaitable of one). The
default script answers a text naming how many messages it saw; to a summary call
(:func:`is_summarizer_request`: :data:`SUMMARIZER_MARKER` in ``system``, or in the last user
message of a call forked from the client's request) it answers a summary built only from counts
in the input (never from its text), so the same input always gets the same summary and no
message text is echoed.

Everything in ``__all__`` gets re-exported.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, Final

from .probes import probe_answer
from .records import RecordedRequest
from .replies import Reply

__all__ = [
    "SUMMARIZER_MARKER",
    "Script",
    "default_script",
    "is_summarizer_request",
    "summary_text",
]

SUMMARIZER_MARKER: Final = "compact-proxy-summarizer"
SUMMARY_HEADINGS: Final = ("Goal", "Decisions", "Failed approaches", "State of the work",
                            "Next step")
# Keys of a tool input that name a file, and that hold a shell command.
FILE_INPUT_KEYS: Final = ("file_path", "path", "notebook_path", "filename")
COMMAND_INPUT_KEYS: Final = ("command", "cmd")
MAX_DECODE_ATTEMPTS: Final = 64

Script = Callable[[dict[str, Any], RecordedRequest], "Reply | Awaitable[Reply]"]


def default_script(body: dict[str, Any], request_meta: RecordedRequest) -> Reply:
    """Answer a summary for the summarizer, a probe from what was sent (``probes``), otherwise
    a short text naming the message count."""
    if is_summarizer_request(body):
        return Reply.text(summary_text(body))
    answer = probe_answer(body)
    if answer is not None:
        return Reply.text(answer)
    count = len(body.get("messages") or ())
    noun = "message" if count == 1 else "messages"
    return Reply.text(f"Fake upstream reply: I saw {count} {noun}.")


def is_summarizer_request(body: Mapping[str, Any]) -> bool:
    """Whether ``body`` is one of the proxy's summary calls: :data:`SUMMARIZER_MARKER` in
    ``system`` (the proxy's own prompt), or in the text of the last ``user`` message (a call
    forked from the client's request keeps the client's ``system`` and asks for the summary
    in a last user turn)."""
    system = body.get("system")
    if isinstance(system, str) and SUMMARIZER_MARKER in system:
        return True
    if isinstance(system, list) and any(
        isinstance(block, Mapping) and SUMMARIZER_MARKER in str(block.get("text", ""))
        for block in system
    ):
        return True
    messages = body.get("messages")
    if not isinstance(messages, list):
        return False
    last_user = next((m for m in reversed(messages)
                      if isinstance(m, Mapping) and m.get("role") == "user"), None)
    return last_user is not None and any(SUMMARIZER_MARKER in t for t in _texts([last_user]))


def _texts(messages: Sequence[Any]) -> Iterator[str]:
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, str):
            yield content
        elif isinstance(content, list):
            for block in content:
                if isinstance(block, Mapping) and isinstance(block.get("text"), str):
                    yield block["text"]


def _embedded_messages(text: str) -> list[Mapping[str, Any]] | None:
    """A message list serialised inside a prompt text (the summarizer sends the old messages
    as JSON): the first ``[`` that decodes to a list of role-carrying objects. Only the first
    :data:`MAX_DECODE_ATTEMPTS` brackets are tried, so a long text costs a bounded amount."""
    decoder = json.JSONDecoder()
    start = text.find("[")
    attempts = 0
    while start != -1 and attempts < MAX_DECODE_ATTEMPTS:
        attempts += 1
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            value = None
        if isinstance(value, list) and value and all(
            isinstance(item, Mapping) and "role" in item for item in value
        ):
            return value
        start = text.find("[", start + 1)
    return None


def _summarized_messages(body: Mapping[str, Any]) -> Sequence[Any]:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    found: list[Mapping[str, Any]] = []
    for text in _texts(messages):
        embedded = _embedded_messages(text)
        if embedded is not None:
            found.extend(embedded)
    return found or messages


def _blocks(messages: Sequence[Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for message in messages:
        if not isinstance(message, Mapping) or not isinstance(message.get("content"), list):
            continue
        for block in message["content"]:
            if isinstance(block, Mapping):
                yield str(message.get("role")), block


def summary_text(body: Mapping[str, Any]) -> str:
    """The deterministic structured summary of a summarizer request's input.

    It has the headings Goal / Decisions / Failed approaches / State of the work / Next step
    (the proxy's summary prompt's) and is
    derived from counts only, so it is never empty and never quotes the conversation.
    """
    messages = _summarized_messages(body)
    roles = Counter(str(m.get("role")) for m in messages if isinstance(m, Mapping))
    first_user = next(
        (m for m in messages if isinstance(m, Mapping) and m.get("role") == "user"), None
    )
    first_len = sum(len(t) for t in _texts([first_user])) if first_user is not None else 0

    tools: Counter[str] = Counter()
    files: set[str] = set()
    commands = 0
    used: set[str] = set()
    answered: set[str] = set()
    errors = 0
    for _, block in _blocks(messages):
        kind = block.get("type")
        if kind == "tool_use":
            tools[str(block.get("name"))] += 1
            used.add(str(block.get("id")))
            tool_input = block.get("input")
            if isinstance(tool_input, Mapping):
                files.update(str(tool_input[k]) for k in FILE_INPUT_KEYS if k in tool_input)
                commands += sum(1 for k in COMMAND_INPUT_KEYS if k in tool_input)
        elif kind == "tool_result":
            answered.add(str(block.get("tool_use_id")))
            errors += 1 if block.get("is_error") is True else 0

    by_name = ", ".join(f"{name} x{count}" for name, count in sorted(tools.items())) or "none"
    open_calls = len(used - answered)
    sections = {
        "Goal": (
            f"Summarized {len(messages)} messages ({roles.get('user', 0)} from the user, "
            f"{roles.get('assistant', 0)} from the assistant); the first user request was "
            f"{first_len} characters long."
        ),
        "Decisions": (
            f"The assistant took {roles.get('assistant', 0)} turns and made "
            f"{sum(tools.values())} tool calls (by name: {by_name})."
        ),
        "Failed approaches": f"{errors} tool results were marked as errors.",
        "State of the work": (
            f"{len(files)} distinct file paths and {commands} commands appeared in tool inputs."
        ),
        "Next step": f"{open_calls} tool calls had no result in the summarized span.",
    }
    return "\n\n".join(f"## {heading}\n{sections[heading]}" for heading in SUMMARY_HEADINGS)
