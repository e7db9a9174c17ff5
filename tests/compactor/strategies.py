"""Hypothesis strategies for valid Messages API histories.

``histories()`` draws a conversation an agent could really send: a first user message, then
turns of an assistant message and the user message answering it, ending on a user turn. The
turns mix what the compactor has to handle:

* plain text turns, string contents and block contents;
* client tool calls, single and parallel, answered in any order, with text (and sometimes an
  image) after the results, ``is_error`` results, and large results (some far over any L1
  limit a test picks), results whose content is a string, text blocks, text plus an image,
  or absent;
* repeated ``Read`` calls of the same ``file_path`` (with and without ``offset``/``limit``) and
  ``str_replace_based_edit_tool`` ``view`` commands, so L2 has work;
* server tool pairs (``server_tool_use`` + ``web_search_tool_result`` in one assistant
  message) and ``mcp_tool_use`` / ``mcp_tool_result`` pairs;
* thinking and redacted_thinking blocks, always first in their assistant message and never
  last, each with its signature or data;
* role-``system`` messages between turns (also between a tool call and its results: they are
  transparent for adjacency);
* ``cache_control`` markers, at most 4 in the whole history.

Every text is built from a fixed vocabulary plus a per-history marker, so a test can tell a
generated text from the numbers and layer names an error carries.
"""

from __future__ import annotations

import base64
import struct
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

__all__ = [
    "MAX_CACHE_CONTROL",
    "READ_PATHS",
    "WORDS",
    "History",
    "Session",
    "histories",
    "png_block",
    "sessions",
]

Message = dict[str, Any]
Block = dict[str, Any]

MAX_CACHE_CONTROL = 4
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
         "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo")
READ_PATHS = ("/repo/src/app.py", "/repo/src/util.py", "/repo/README.md", "/repo/tests/test_app.py")
BASH_COMMANDS = ("ls -la", "pytest -q", "git status", "make build", "cat /etc/hosts")


@dataclass
class _Budget:
    """What a history under construction has used: ids, cache markers, a text marker."""

    marker: str
    next_id: int = 0
    cache_left: int = MAX_CACHE_CONTROL
    texts: list[str] = field(default_factory=list)

    def new_id(self, prefix: str) -> str:
        self.next_id += 1
        return f"{prefix}_{self.marker}{self.next_id:03d}"


@dataclass(frozen=True)
class History:
    """A generated history and every text written into it (to look for leaks)."""

    messages: list[Message]
    texts: tuple[str, ...]


def png_block(width: int, height: int) -> Block:
    """An image block whose base64 data is a real PNG header of the given size."""
    header = (b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + struct.pack(">II", width, height)
              + b"\x08\x02\x00\x00\x00" + b"\x00" * 16)
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                        "data": base64.b64encode(header).decode("ascii")}}


def _text(draw: st.DrawFn, budget: _Budget, *, min_words: int = 1, max_words: int = 12) -> str:
    words = draw(st.lists(st.sampled_from(WORDS), min_size=min_words, max_size=max_words))
    value = f"{budget.marker} " + " ".join(words) if words else budget.marker
    budget.texts.append(value)
    return value


def _large_text(draw: st.DrawFn, budget: _Budget) -> str:
    """Output of tens to tens of thousands of characters, line by line.

    Three bands: a few lines, around L1's smallest cut (200 to 450 characters: the head, the
    marker and the tail of a cut can outgrow such a text), and far over any limit.
    """
    lines = draw(st.one_of(st.integers(1, 40), st.integers(6, 13), st.integers(40, 1500)))
    word = draw(st.sampled_from(WORDS))
    value = "\n".join(f"{budget.marker} {word} output line {i:05d}" for i in range(lines))
    budget.texts.append(value)
    return value


def _maybe_cache(draw: st.DrawFn, budget: _Budget, block: Block) -> Block:
    if budget.cache_left and draw(st.integers(0, 9)) == 0:
        budget.cache_left -= 1
        return {**block, "cache_control": {"type": "ephemeral"}}
    return block


def _text_block(draw: st.DrawFn, budget: _Budget) -> Block:
    return _maybe_cache(draw, budget, {"type": "text", "text": _text(draw, budget)})


def _thinking_prefix(draw: st.DrawFn, budget: _Budget) -> list[Block]:
    blocks: list[Block] = []
    for kind in draw(st.lists(st.sampled_from(("thinking", "redacted_thinking")),
                              min_size=1, max_size=2)):
        if kind == "thinking":
            blocks.append({"type": "thinking", "thinking": _text(draw, budget, max_words=30),
                           "signature": f"EqQB{budget.new_id('sig')}Zm9v"})
        else:
            blocks.append({"type": "redacted_thinking",
                           "data": f"EmwK{budget.new_id('red')}YmFy" * draw(st.integers(1, 8))})
    return blocks


def _server_pair(draw: st.DrawFn, budget: _Budget) -> list[Block]:
    if draw(st.booleans()):
        use_id = budget.new_id("srvtoolu")
        query = _text(draw, budget, max_words=4)
        return [
            {"type": "server_tool_use", "id": use_id, "name": "web_search",
             "input": {"query": query}},
            {"type": "web_search_tool_result", "tool_use_id": use_id, "content": [
                {"type": "web_search_result", "url": f"https://example.org/{i}",
                 "title": _text(draw, budget, max_words=3), "encrypted_content": "Eo8BCkYIBxgC"}
                for i in range(draw(st.integers(1, 3)))]},
        ]
    use_id = budget.new_id("mcptoolu")
    return [
        {"type": "mcp_tool_use", "id": use_id, "name": "lookup", "server_name": "docs",
         "input": {"q": _text(draw, budget, max_words=3)}},
        {"type": "mcp_tool_result", "tool_use_id": use_id, "is_error": draw(st.booleans()),
         "content": [{"type": "text", "text": _text(draw, budget)}]},
    ]


def _tool_call(draw: st.DrawFn, budget: _Budget) -> Block:
    use_id = budget.new_id("toolu")
    kind = draw(st.sampled_from(("read", "read", "view", "edit", "bash", "bash")))
    if kind == "read":
        tool_input: dict[str, Any] = {"file_path": draw(st.sampled_from(READ_PATHS))}
        if draw(st.integers(0, 3)) == 0:
            tool_input["offset"] = draw(st.sampled_from((1, 100)))
            tool_input["limit"] = draw(st.sampled_from((50, 200)))
        name = "Read"
    elif kind == "view":
        tool_input = {"command": "view", "path": draw(st.sampled_from(READ_PATHS))}
        if draw(st.booleans()):
            tool_input["view_range"] = [1, draw(st.sampled_from((20, 80)))]
        name = "str_replace_based_edit_tool"
    elif kind == "edit":
        tool_input = {"command": "str_replace", "path": draw(st.sampled_from(READ_PATHS)),
                      "old_str": _text(draw, budget, max_words=3),
                      "new_str": _text(draw, budget, max_words=3)}
        name = "str_replace_based_edit_tool"
    else:
        tool_input = {"command": draw(st.sampled_from(BASH_COMMANDS))}
        name = "Bash"
    return _maybe_cache(draw, budget, {"type": "tool_use", "id": use_id, "name": name,
                                       "input": tool_input})


def _tool_result(draw: st.DrawFn, budget: _Budget, use_id: str) -> Block:
    block: Block = {"type": "tool_result", "tool_use_id": use_id}
    shape = draw(st.sampled_from(("string", "string", "blocks", "with_image", "absent")))
    body = _large_text(draw, budget) if draw(st.integers(0, 2)) == 0 else _text(draw, budget)
    if shape == "string":
        block["content"] = body
    elif shape == "blocks":
        block["content"] = [_maybe_cache(draw, budget, {"type": "text", "text": body})]
    elif shape == "with_image":
        block["content"] = [{"type": "text", "text": body},
                            png_block(draw(st.integers(1, 3000)), draw(st.integers(1, 3000)))]
    if draw(st.integers(0, 5)) == 0:
        block["is_error"] = True
    return _maybe_cache(draw, budget, block)


def _system_message(draw: st.DrawFn, budget: _Budget) -> Message:
    if draw(st.booleans()):
        return {"role": "system", "content": _text(draw, budget)}
    return {"role": "system", "content": [{"type": "text", "text": _text(draw, budget)}]}


def _assistant(draw: st.DrawFn, budget: _Budget) -> tuple[Message, list[str]]:
    """An assistant message and the ids of its client tool calls (answered next)."""
    if draw(st.integers(0, 5)) == 0:
        return {"role": "assistant", "content": _text(draw, budget)}, []
    blocks: list[Block] = []
    if draw(st.integers(0, 2)) == 0:
        blocks.extend(_thinking_prefix(draw, budget))
    for part in draw(st.lists(st.sampled_from(("text", "text", "server")), max_size=3)):
        blocks.extend([_text_block(draw, budget)] if part == "text" else _server_pair(draw, budget))
    calls = [_tool_call(draw, budget) for _ in range(draw(st.sampled_from((0, 1, 1, 1, 2, 3))))]
    blocks.extend(calls)
    if draw(st.integers(0, 6)) == 0 and calls:
        blocks.append(_text_block(draw, budget))  # text after the calls
    if not blocks or blocks[-1]["type"] in ("thinking", "redacted_thinking"):
        blocks.append(_text_block(draw, budget))
    return {"role": "assistant", "content": blocks}, [c["id"] for c in calls]


def _user_answer(draw: st.DrawFn, budget: _Budget, call_ids: list[str]) -> Message:
    if not call_ids:
        if draw(st.booleans()):
            return {"role": "user", "content": _text(draw, budget)}
        return {"role": "user", "content": [_text_block(draw, budget)
                                            for _ in range(draw(st.integers(1, 2)))]}
    order = draw(st.permutations(call_ids))
    blocks = [_tool_result(draw, budget, use_id) for use_id in order]
    if draw(st.integers(0, 3)) == 0:
        blocks.append(_text_block(draw, budget))  # text after the results
    if draw(st.integers(0, 9)) == 0:
        blocks.append(png_block(draw(st.integers(1, 800)), draw(st.integers(1, 800))))
    return {"role": "user", "content": blocks}


@st.composite
def histories(draw: st.DrawFn, *, min_turns: int = 0, max_turns: int = 12) -> History:
    """A valid history: first user message, turns, ending on a user message."""
    budget = _Budget(marker=f"zq{draw(st.integers(0, 9999)):04d}")
    first: Message
    if draw(st.booleans()):
        first = {"role": "user", "content": _text(draw, budget, min_words=3)}
    else:
        first = {"role": "user", "content": [_text_block(draw, budget)
                                             for _ in range(draw(st.integers(1, 2)))]}
    messages: list[Message] = [first]
    for _ in range(draw(st.integers(min_turns, max_turns))):
        if draw(st.integers(0, 7)) == 0:
            messages.append(_system_message(draw, budget))
        assistant, call_ids = _assistant(draw, budget)
        messages.append(assistant)
        if draw(st.integers(0, 9)) == 0:
            messages.append(_system_message(draw, budget))  # between a call and its results
        messages.append(_user_answer(draw, budget, call_ids))
    return History(messages, tuple(budget.texts))


@dataclass(frozen=True)
class Session:
    """A generated agent session: its messages, whether thinking is on, and its texts."""

    messages: list[Message]
    thinking: bool
    texts: tuple[str, ...]

    def body(self) -> dict[str, Any]:
        """The request body a client would send for it."""
        body: dict[str, Any] = {"model": "claude-sonnet-4-5", "max_tokens": 4096,
                                "messages": self.messages}
        if self.thinking:
            body["thinking"] = {"type": "enabled", "budget_tokens": 2048}
        return body


def _loop_step(draw: st.DrawFn, budget: _Budget, *, think: bool) -> tuple[Message, list[str]]:
    """One assistant message of a tool loop (at least one client call) and its call ids."""
    blocks: list[Block] = _thinking_prefix(draw, budget) if think else []
    if draw(st.booleans()):
        blocks.append(_text_block(draw, budget))
    if draw(st.integers(0, 5)) == 0:
        blocks.extend(_server_pair(draw, budget))
    calls = [_tool_call(draw, budget) for _ in range(draw(st.sampled_from((1, 1, 1, 2, 3))))]
    blocks.extend(calls)
    return {"role": "assistant", "content": blocks}, [c["id"] for c in calls]


def _loop_answer(draw: st.DrawFn, budget: _Budget, call_ids: list[str]) -> Message:
    """The results of a loop step; sometimes with text after them (as Claude Code appends
    reminders), never without a result."""
    blocks = [_tool_result(draw, budget, use_id) for use_id in draw(st.permutations(call_ids))]
    if draw(st.integers(0, 4)) == 0:
        blocks.append(_text_block(draw, budget))
    return {"role": "user", "content": blocks}


@st.composite
def sessions(draw: st.DrawFn, *, thinking: bool | None = None, max_turns: int = 4,
             max_steps: int = 10) -> Session:
    """A session shaped like a real agent's: turns, each a person's message and then one
    assistant turn that is a tool loop of several steps, ending with a text answer — except,
    often, the last turn, still in progress (the request ends on tool results).

    With thinking on, each turn's first assistant message starts with thinking (and, with
    interleaved thinking, drawn per session, every step does), as the model answers.
    """
    think = draw(st.booleans()) if thinking is None else thinking
    interleaved = think and draw(st.booleans())
    budget = _Budget(marker=f"zq{draw(st.integers(0, 9999)):04d}")
    messages: list[Message] = [{"role": "user", "content": _text(draw, budget, min_words=3)}]
    turns = draw(st.integers(1, max_turns))
    for turn in range(turns):
        if turn:
            messages.append({"role": "user", "content": [_text_block(draw, budget)]})
        steps = draw(st.integers(0, max_steps))
        for step in range(steps):
            if draw(st.integers(0, 9)) == 0:
                messages.append(_system_message(draw, budget))
            assistant, call_ids = _loop_step(draw, budget,
                                             think=think and (step == 0 or interleaved))
            messages.append(assistant)
            messages.append(_loop_answer(draw, budget, call_ids))
        last_turn = turn == turns - 1
        if last_turn and steps and draw(st.integers(0, 3)) != 0:
            break  # the turn is still in progress: the request ends on tool results
        closing: list[Block] = []
        if think and (steps == 0 or interleaved):
            closing.extend(_thinking_prefix(draw, budget))
        closing.append(_text_block(draw, budget))
        messages.append({"role": "assistant", "content": closing})
        if last_turn:
            messages.append({"role": "user", "content": _text(draw, budget)})
    return Session(messages, think, tuple(budget.texts))

