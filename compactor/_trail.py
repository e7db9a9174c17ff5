"""The artifact trail: which files the dropped or summarised tool calls read, wrote or edited,
and which commands they ran (with the exit status where the result shows it).

Taken from the ``tool_use`` inputs and results alone, so paths and commands are exact (rules:
docs/how-it-works.md). Which entries fit the budget is decided here too (``entries_within``),
so the bench measures the same rule.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from policies import ReadToolSpec

from ._blocks import CLIENT_RESULT, CLIENT_USE, Message, blocks_of

PATH_KEYS = ("file_path", "path", "notebook_path")
_WRITES = frozenset({"Write", "write_file", "create_file", "NotebookWrite"})
_EDITS = frozenset({"Edit", "MultiEdit", "NotebookEdit", "edit_file", "str_replace", "apply_patch"})
#: The text editor tool's commands, by what they do to the file.
_EDITOR = {"view": "read", "create": "wrote", "str_replace": "edited", "insert": "edited",
           "undo_edit": "edited"}
_EXIT = re.compile(r"(?:^|\n)\s*(?:Exit code|exit code|exit status|Exit status)[:\s]+(-?\d+)")
#: The exit status an entry ends with (``_status``).
STATUS = re.compile(r" \((?:exit -?\d+|failed)\)$")
#: What an entry longer than the whole budget keeps of its first line.
CUT_HEAD_CHARS = 200
ENTRY_OPEN, ENTRY_CLOSE = "<trail-entry>", "</trail-entry>"


def _result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, str):
        return content[:400]
    parts = [b.get("text", "") for b in content or [] if isinstance(b, dict)]
    return "".join(p for p in parts if isinstance(p, str))[:400]


def _status(result: dict[str, Any] | None) -> str:
    if result is None:
        return ""
    found = _EXIT.search(_result_text(result))
    if found:
        return f" (exit {found.group(1)})"
    return " (failed)" if result.get("is_error") is True else ""


def _entry(block: dict[str, Any], reads: Iterable[ReadToolSpec]) -> tuple[str, str] | None:
    """``(verb, what)`` for one tool call, or None when it touches no file and runs nothing."""
    name = block.get("name")
    tool_input = block.get("input")
    if not isinstance(name, str) or not isinstance(tool_input, dict):
        return None
    path = next((v for k in PATH_KEYS if isinstance(v := tool_input.get(k), str) and v), None)
    command = tool_input.get("command")
    if path is not None:
        if isinstance(command, str) and command in _EDITOR:
            return _EDITOR[command], path
        if any(spec.name == name and spec.command is None for spec in reads):
            return "read", path
        if name in _WRITES:
            return "wrote", path
        if name in _EDITS:
            return "edited", path
        return f"{name}:", path
    if isinstance(command, str) and command.strip():
        return "ran", command
    return None


def artifact_trail(messages: Iterable[Message], reads: Iterable[ReadToolSpec]) -> list[str]:
    """The trail of ``messages``: one entry per file and verb or per command, at the place
    of its latest call, newest last."""
    reads = tuple(reads)
    calls: list[tuple[str, str, str]] = []  # (tool_use id, verb, what)
    results: dict[str, dict[str, Any]] = {}
    for message in messages:
        for block in blocks_of(message):
            kind = block.get("type")
            if kind == CLIENT_USE:
                entry = _entry(block, reads)
                if entry is not None:
                    calls.append((str(block.get("id")), *entry))
            elif kind == CLIENT_RESULT and isinstance(block.get("tool_use_id"), str):
                results[block["tool_use_id"]] = block
    lines: dict[tuple[str, str], str] = {}
    for tool_id, verb, what in calls:
        status = _status(results.get(tool_id)) if verb == "ran" else ""
        key = (verb, what)
        lines.pop(key, None)
        lines[key] = f"{verb} {what}{status}"
    return list(lines.values())


def render_entry(entry: str) -> str:
    """``entry`` as it stands in the trail: one line, or a command of several lines between
    ``<trail-entry>`` lines (so a merge reads it back whole)."""
    return f"{ENTRY_OPEN}\n{entry}\n{ENTRY_CLOSE}" if "\n" in entry else entry


def entry_cost(entry: str, count: Callable[[str], int]) -> int:
    """What ``entry`` costs in the trail: its rendered text and the line break after it."""
    return count(render_entry(entry) + "\n")


def cut_entry(entry: str) -> str:
    """``entry`` cut to the start of its first line, its exit status kept (an entry that
    alone costs more than the whole budget)."""
    status = STATUS.search(entry)
    suffix = status.group(0) if status else ""
    body = entry[: len(entry) - len(suffix)]
    head = body.split("\n", 1)[0][:CUT_HEAD_CHARS]
    return f"{head} …[cut: {len(body) - len(head)} more chars]{suffix}"


def entries_within(entries: list[str], budget: int, count: Callable[[str], int]) -> list[str]:
    """The newest of ``entries`` that fit ``budget`` together, in order: filled newest first
    up to the first that does not fit, one over the whole budget as :func:`cut_entry`."""
    kept: list[str] = []
    used = 0
    for entry in reversed(entries):
        cost = entry_cost(entry, count)
        if cost > budget:
            entry = cut_entry(entry)
            cost = entry_cost(entry, count)
        used += cost
        if used > budget:
            break
        kept.append(entry)
    return kept[::-1]
