"""What the benchmarks send.

A deterministic coding agent's session (:class:`AgentSession`), histories of a given size, the
small exchange warm cells grow by, and the request body and headers as Claude Code sends them.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any, Final

from bench.harness.config import BENCH_API_KEY, MODEL, SESSION_HEADER, SESSION_SEED

_MODULES: Final = ("parser", "lexer", "ast_nodes", "codegen", "optimizer", "runtime", "cli",
                   "config", "errors", "cache", "io_utils", "scheduler")
_FILES: Final = tuple(f"/repo/src/engine/{m}.py" for m in _MODULES)
_THOUGHTS: Final = (
    "Let me look at {file} before changing anything.",
    "The failure points at {file}; I'll check how the step functions handle overflow there.",
    "Running the tests again to see whether the last change fixed the overflow.",
    "I need to find every caller of the step helpers first.",
    "That edit should make {file} raise only past the configured limit. Checking the result.",
    "The scheduler still calls the old helper, so I'll update it next.",
)


def _system_prompt() -> list[dict[str, Any]]:
    rules = [
        f"{n}. When working on task area {n % 9}, prefer small verified steps: read the code, "
        f"make one change, run the relevant tests, and report what changed and why (rule {n})."
        for n in range(1, 90)
    ]
    return [
        {"type": "text",
         "text": "x-anthropic-billing-header: cc_version=2.1.0; cc_entrypoint=cli;"},
        {"type": "text", "text": "You are a coding agent working in /repo.\n" + "\n".join(rules),
         "cache_control": {"type": "ephemeral"}},
    ]


def _tools() -> list[dict[str, Any]]:
    def tool(name: str, description: str, **properties: str) -> dict[str, Any]:
        return {"name": name, "description": description, "input_schema": {
            "type": "object",
            "properties": {key: {"type": kind} for key, kind in properties.items()},
            "required": list(properties)[:1],
        }}

    return [
        tool("Read", "Read a file from the local filesystem, with line numbers.",
             file_path="string", offset="integer", limit="integer"),
        tool("Edit", "Replace an exact string in a file.", file_path="string",
             old_string="string", new_string="string"),
        tool("Bash", "Run a shell command and return its output.", command="string",
             timeout="integer"),
        tool("Grep", "Search file contents with a regular expression.", pattern="string",
             path="string"),
    ]


SYSTEM: Final = _system_prompt()
TOOLS: Final = _tools()


def _source(path: str, version: int) -> str:
    """A Python file as Claude Code's Read shows it (numbered lines), deterministic."""
    name = path.rsplit("/", 1)[1].removesuffix(".py")
    size = 120 + (sum(map(ord, name)) * 37) % 330  # 120..449 lines, fixed per file
    lines = [f'"""{name}: one stage of the engine (revision {version})."""', "",
             "from __future__ import annotations", ""]
    step = 0
    while len(lines) < size:
        step += 1
        lines += [
            f"def {name}_step_{step}(state: dict[str, int], value: int) -> int:",
            f'    """Advance {name} by one step ({step}, revision {version})."""',
            f"    total = state.get('{name}_{step}', 0) + value * {step % 7 + 1 + version}",
            f"    if total > {100 + step * 3}:",
            f"        raise ValueError(f'{name} step {step} overflow: {{total}}')",
            f"    state['{name}_{step}'] = total",
            "    return total",
            "",
        ]
    return "\n".join(f"{n:6d}\t{line}" for n, line in enumerate(lines[:size], 1))


def _pytest_log(rng: random.Random, turn: int) -> tuple[str, bool]:
    count = rng.randint(250, 700)
    failed = rng.random() < 0.5
    lines = [f"============================= test session starts (turn {turn}) ==========",
             f"collected {count} items", ""]
    for i in range(count):
        module = _MODULES[i % len(_MODULES)]
        outcome = "FAILED" if failed and i == count // 2 else "PASSED"
        lines.append(f"tests/test_{module}.py::test_{module}_case_{i} {outcome:<8}"
                     f" [{(i + 1) * 100 // count:3d}%]")
    if failed:
        module = _MODULES[turn % len(_MODULES)]
        lines += ["", "=================================== FAILURES ===================",
                  f"_____________________ test_{module}_case_{count // 2} _______________"]
        lines += [f"src/engine/{module}.py:{40 + k}: in {module}_step_{k}\n"
                  f"    raise ValueError(f'{module} step {k} overflow: {{total}}')"
                  for k in range(1, 14)]
        lines.append(f"E   ValueError: {module} step 13 overflow: {rng.randint(200, 999)}")
    summary = f"1 failed, {count - 1} passed" if failed else f"{count} passed"
    lines.append(f"======================= {summary} in {rng.uniform(2, 30):.2f}s ========")
    return "\n".join(lines), failed


def _grep_output(rng: random.Random, pattern: str) -> str:
    hits = []
    for _ in range(rng.randint(15, 70)):
        module = rng.choice(_MODULES)
        step = rng.randint(1, 50)
        hits.append(f"src/engine/{module}.py:{step * 8 + 3}:    total = state.get("
                    f"'{module}_{step}', 0) + value * {step % 7 + 1}  # {pattern}")
    return "\n".join(hits)


class AgentSession:
    """A deterministic coding-agent session: one ``(assistant, user)`` exchange per turn.

    The assistant explains and calls one tool; the user message carries its result. The mix:
    file reads (a working set, so the same files are read again and again, also after they
    were edited), edits, test runs with long logs, greps and short shell commands.
    """

    def __init__(self, seed: int = SESSION_SEED) -> None:
        self._rng = random.Random(seed)
        self._versions = dict.fromkeys(_FILES, 0)
        self._recent: list[str] = list(_FILES[:3])
        self.turn = 0

    @staticmethod
    def first_message() -> dict[str, Any]:
        """The user's task, the first message of the session."""
        return {"role": "user", "content": [{"type": "text", "text": (
            "The engine's step functions raise overflow errors too early. Find out why, fix "
            "it in every module, keep the public helpers' names, and make the whole test "
            "suite pass. Explain each change briefly.")}]}

    def _pick_file(self) -> str:
        if self._rng.random() < 0.7:
            return self._rng.choice(self._recent)
        path = self._rng.choice(_FILES)
        self._recent = [path, *[p for p in self._recent if p != path]][:4]
        return path

    def next_exchange(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The next turn's assistant message (text + tool call) and user message (result)."""
        self.turn += 1
        rng = self._rng
        tool_id = f"toolu_bench_{self.turn:05d}"
        path = self._pick_file()
        roll = rng.random()
        is_error = False
        if roll < 0.30:
            name, tool_input = "Read", {"file_path": path}
            result = _source(path, self._versions[path])
        elif roll < 0.46:
            step = rng.randint(1, 40)
            name, tool_input = "Edit", {
                "file_path": path,
                "old_string": f"    if total > {100 + step * 3}:",
                "new_string": f"    if total > limit_for(state, {100 + step * 3}):",
            }
            self._versions[path] += 1
            result = f"The file {path} has been updated successfully."
        elif roll < 0.60:
            name, tool_input = "Bash", {"command": "python -m pytest -q tests/"}
            result, is_error = _pytest_log(rng, self.turn)
        elif roll < 0.82:
            pattern = f"step_{rng.randint(1, 50)}"
            name, tool_input = "Grep", {"pattern": pattern, "path": "src/"}
            result = _grep_output(rng, pattern)
        else:
            name, tool_input = "Bash", {"command": rng.choice(("git status", "ls src/engine",
                                                               "git diff --stat"))}
            result = "\n".join(f" M src/engine/{m}.py" for m in rng.sample(_MODULES, 5))
        thought = rng.choice(_THOUGHTS).format(file=path)
        assistant = {"role": "assistant", "content": [
            {"type": "text", "text": f"{thought} (step {self.turn})"},
            {"type": "tool_use", "id": tool_id, "name": name, "input": tool_input},
        ]}
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_id, "content": result}
        if is_error:
            block["is_error"] = True
        return assistant, {"role": "user", "content": [block]}


def history_of_size(target_bytes: int, seed: int = SESSION_SEED) -> list[dict[str, Any]]:
    """The agent session's first message and as many exchanges as make a request body
    (:func:`request_body`: system, tools and messages) of about ``target_bytes``, never less."""
    agent = AgentSession(seed)
    messages = [agent.first_message()]
    size = len(request_body(messages, stream=False))
    while size < target_bytes:
        exchange = agent.next_exchange()
        messages.extend(exchange)
        size += sum(len(json.dumps(m)) for m in exchange) + 2
    return messages


def tiny_exchange(index: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """One small exchange (``ls``), as the warm latency cells grow their history by."""
    tool_id = f"toolu_grow_{index:06d}"
    return (
        {"role": "assistant", "content": [
            {"type": "text", "text": "Listing the directory once more."},
            {"type": "tool_use", "id": tool_id, "name": "Bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tool_id,
             "content": "cli.py\ncodegen.py\nlexer.py"}]},
    )


def request_body(messages: Sequence[dict[str, Any]], *, stream: bool) -> bytes:
    """The request as Claude Code would send it: cached system and tools, and a cache
    breakpoint on the last block of the last message (moved there every turn)."""
    last = messages[-1]
    content = last["content"]
    if isinstance(content, list) and content:
        last = {**last, "content": [*content[:-1],
                                    {**content[-1], "cache_control": {"type": "ephemeral"}}]}
    body = {"model": MODEL, "max_tokens": 1024, "system": SYSTEM, "tools": TOOLS,
            "messages": [*messages[:-1], last], "stream": stream}
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def request_headers(session_id: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    headers = {"x-api-key": BENCH_API_KEY, "anthropic-version": "2023-06-01",
               "content-type": "application/json", SESSION_HEADER: session_id}
    headers.update(extra or {})
    return headers


