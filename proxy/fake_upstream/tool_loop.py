"""``compact-proxy fake-upstream --script tool-loop --steps N``: the fake provider plays a model
working through a task with the tools the request offers, so an agent (Claude Code, an SDK
loop) runs several steps offline; ``--dump DIR`` writes every request it received.

The loop is stateless: each tool call's id carries its step (``toolu_loop_003``), and the step
of a request is read from the ``tool_result`` in its last message, so a history the proxy has
compacted (or several agents at once) still gets the right next step. With Claude Code's tools
it cycles Glob, Read (a file the previous result named, under the working directory
Claude Code's system prompt gives) and Bash; with any other tools it
calls the first custom tool with an input built from its ``input_schema``. After ``N`` calls
it answers a final text. With thinking on, the turn's first answer opens with a thinking
block, as the provider requires of a tool loop.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from .records import RecordedRequest
from .replies import Reply, text_block, thinking_block, tool_use_block
from .scripts import default_script, is_summarizer_request

__all__ = ["RequestDump", "ToolLoopScript"]

TOOL_ID_PREFIX: Final = "toolu_loop_"
_STEP_ID: Final = re.compile(re.escape(TOOL_ID_PREFIX) + r"(\d+)$")
# Claude Code's tools the loop prefers, in the order it cycles through them.
CLAUDE_CODE_CYCLE: Final = ("Glob", "Read", "Bash")
_FIRST_PATH: Final = re.compile(r"^\s*([\w./-]+\.\w+)\s*$", re.MULTILINE)
# Claude Code's system prompt names its working directory ("Primary working directory: /…").
_WORKING_DIRECTORY: Final = re.compile(r"working directory:\s*(/\S+)", re.IGNORECASE)
# Headers a dump leaves out: credentials are never written to disk.
_SECRET_HEADERS: Final = frozenset({"x-api-key", "authorization", "proxy-authorization",
                                    "cookie"})


class ToolLoopScript:
    """The model's side of an ``steps``-step task (a script for :class:`FakeUpstream`)."""

    def __init__(self, steps: int) -> None:
        if steps < 0:
            raise ValueError(f"steps must be >= 0, got {steps}")
        self.steps = steps

    def __call__(self, body: dict[str, Any], meta: RecordedRequest) -> Reply:
        if is_summarizer_request(body):
            return default_script(body, meta)
        messages = body.get("messages") or []
        done, last_result = _last_step(messages)
        tools = _custom_tools(body)
        choice = body.get("tool_choice")
        forbidden = isinstance(choice, Mapping) and choice.get("type") == "none"
        if done >= self.steps or not tools or forbidden:
            noun = "step" if done == 1 else "steps"
            return Reply.text(f"Tool loop finished: {done} tool {noun} over "
                              f"{len(messages)} messages.")
        step = done + 1
        path = _found_path(last_result, body.get("system"))
        name, tool_input = _next_call(step, tools, choice, path)
        blocks: list[Mapping[str, Any]] = []
        if _thinking_on(body) and done == 0:
            blocks.append(thinking_block(f"Plan: {self.steps} tool steps, one at a time."))
        blocks.append(text_block(f"Step {step} of {self.steps}: {name}."))
        blocks.append(tool_use_block(f"{TOOL_ID_PREFIX}{step:03d}", name, tool_input))
        return Reply(content=blocks, stop_reason="tool_use")


def _thinking_on(body: Mapping[str, Any]) -> bool:
    thinking = body.get("thinking")
    return isinstance(thinking, Mapping) and thinking.get("type") in ("enabled", "adaptive")


def _last_step(messages: Sequence[Any]) -> tuple[int, str]:
    """The step the last message answers (0 when it answers none of the loop's calls) and the
    text of that tool result."""
    last = messages[-1] if messages else None
    content = last.get("content") if isinstance(last, Mapping) else None
    if not isinstance(content, list):
        return 0, ""
    for block in content:
        if not isinstance(block, Mapping) or block.get("type") != "tool_result":
            continue
        found = _STEP_ID.match(str(block.get("tool_use_id", "")))
        if found:
            return int(found.group(1)), _result_text(block.get("content"))
    return 0, ""


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(b.get("text", "")) for b in content
                         if isinstance(b, Mapping) and b.get("type") == "text")
    return ""


def _found_path(result: str, system: Any) -> str | None:
    """The first file a tool result lists, made absolute with the working directory."""
    found = _FIRST_PATH.search(result)
    if found is None:
        return None
    path = found.group(1)
    if path.startswith("/"):
        return path
    cwd = _WORKING_DIRECTORY.search(_system_text(system))
    return f"{cwd.group(1).rstrip('/')}/{path}" if cwd else None


def _system_text(system: Any) -> str:
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        return "\n\n".join(str(b.get("text", "")) for b in system if isinstance(b, Mapping))
    return ""


def _custom_tools(body: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The client tools the request offers (server tools such as web search left out)."""
    tools = body.get("tools")
    if not isinstance(tools, list):
        return {}
    return {str(tool["name"]): tool for tool in tools
            if isinstance(tool, Mapping) and isinstance(tool.get("name"), str)
            and tool.get("type") in (None, "custom") and "input_schema" in tool}


def _next_call(step: int, tools: Mapping[str, Mapping[str, Any]], choice: Any,
               path: str | None) -> tuple[str, dict[str, Any]]:
    if isinstance(choice, Mapping) and choice.get("type") == "tool" and choice.get("name") in tools:
        name = str(choice["name"])
        return name, _schema_input(tools[name].get("input_schema"), step)
    cycle = [n for n in CLAUDE_CODE_CYCLE if n in tools]
    if cycle:
        name = cycle[(step - 1) % len(cycle)]
        if name == "Read" and not path:  # nothing found to read: the next tool instead
            name = next((n for n in cycle if n != "Read"), name)
        if name == "Glob":
            return name, {"pattern": "*"}
        if name == "Read" and path:
            return name, {"file_path": path}
        return name, {"command": f"echo step {step} && ls",
                      "description": f"List the files (step {step})"}
    name = next(iter(tools))
    return name, _schema_input(tools[name].get("input_schema"), step)


def _schema_input(schema: Any, step: int) -> dict[str, Any]:
    """An input naming every required property of a JSON schema, each a plain value of its
    type (the first of an ``enum``)."""
    if not isinstance(schema, Mapping):
        return {}
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    required = schema.get("required")
    names = required if isinstance(required, list) else []
    return {str(name): _value(properties.get(name), step) for name in names}


def _value(schema: Any, step: int) -> Any:
    if not isinstance(schema, Mapping):
        return f"step {step}"
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    kind = schema.get("type")
    kind = kind[0] if isinstance(kind, list) and kind else kind
    if kind == "object":
        return _schema_input(schema, step)
    return {"integer": step, "number": step, "boolean": True, "array": [],
            "null": None}.get(str(kind), f"step {step}")


class RequestDump:
    """Writes each request the fake received to ``directory``: ``0001-messages.json`` (method,
    path, query, headers without credentials, body) and, for a request with a ``system``, its
    text as ``0001-system.txt`` — what the proxy forwarded, readable as is."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.count = 0

    def __call__(self, record: RecordedRequest) -> None:
        self.count += 1
        route = record.path.strip("/").removeprefix("v1/").replace("/", "-") or "root"
        stem = self.directory / f"{self.count:04d}-{route}"
        headers = {k: v for k, v in record.headers.items() if k not in _SECRET_HEADERS}
        dumped = {"method": record.method, "path": record.path, "query": record.query_string,
                  "request_id": record.request_id, "headers": headers, "body": record.body}
        Path(f"{stem}.json").write_text(json.dumps(dumped, indent=2, ensure_ascii=False),
                                             encoding="utf-8")
        system = record.body.get("system") if isinstance(record.body, Mapping) else None
        if system:
            Path(f"{stem}-system.txt").write_text(_system_text(system), encoding="utf-8")
