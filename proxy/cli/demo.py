"""``compact-proxy demo``: the whole product, offline (no network, no API key), in one command.

It starts the strict fake provider and the proxy on free loopback ports, writes one durable
fact through the admin API, then plays a scripted coding agent through the real ``anthropic``
SDK, printing the tokens before and after compaction and the layers that ran, until a huge
pasted log that cannot fit is blocked, with the audit line the proxy wrote for it.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import secrets
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO

import aiohttp
import anthropic

from proxy.accounting.ledger_buffer import BufferedLedger
from proxy.accounting.report import build_report
from proxy.config import Config
from proxy.fake_upstream import FakeUpstream, RecordedRequest, Reply, start_fake_upstream
from proxy.fake_upstream.scripts import default_script, is_summarizer_request
from proxy.http.keys import SERVICES
from proxy.server.app import start_proxy
from proxy.telemetry.logs import configure_logging

__all__ = ["main"]

ADMIN_TOKEN_ENV: Final = "COMPACT_PROXY_DEMO_ADMIN_TOKEN"
SESSION_ID: Final = "demo-session"
MODEL: Final = "claude-sonnet-4-5"
# Small thresholds so a few dozen requests show every layer at work.
COMPACTION: Final = {
    "soft_threshold_tokens": 6_000,
    "hard_limit_tokens": 9_000,
    "max_tool_result_tokens": 700,
    "keep_recent_messages": 20,
    "summary_keep_recent": 4,
    "token_counter": "tiktoken",
}
PROVIDER_TOKEN_RATIO: Final = 1.3
PROVIDER_TOKEN_NOISE: Final = 0.1
# Claude Code marks its subagents with this header; the demo's subagent role has L4 off, so
# its history is pruned by L3 instead of summarised.
SUBAGENT_HEADER: Final = "x-claude-code-agent-id"
SUBAGENT_ROLE: Final = {"summary_enabled": False, "keep_recent_messages": 8}


def _source_file(version: int) -> str:
    lines = [f"def parse_{n}(text):  # parser.py v{version}\n    return text.split({n!r})\n"
             for n in range(80)]
    return "".join(lines)


def _test_log(run: int, failing: bool) -> str:
    lines = [f"tests/test_parser.py::test_case_{n} PASSED  [{n % 100:3d}%]  run {run}"
             for n in range(700)]
    if failing:
        lines.append("tests/test_parser.py::test_split_empty FAILED")
        lines.append("E   AssertionError: expected [] but got ['']")
        lines.append("=========== 1 failed, 700 passed in 3.21s ===========")
    else:
        lines.append("=========== 701 passed in 3.02s ===========")
    return "\n".join(lines)


@dataclass
class Step:
    """One agent turn: the tool the model asks for, and what running it returns."""

    name: str
    tool_input: dict[str, Any]
    output: str
    note: str


def _subagent_plan() -> list[Step]:
    def read(n: int, verb: str = "reads") -> Step:
        return Step("Read", {"file_path": f"docs/chapter_{n}.md"}, _source_file(100 + n),
                    f"subagent {verb} chapter {n}")

    # Chapter 9 read again: L2 drops the older read of it from the view.
    return [*map(read, range(1, 11)), read(9, "re-reads"), *map(read, range(11, 14))]


def _plan() -> list[Step]:
    steps = [
        Step("Read", {"file_path": "src/parser.py"}, _source_file(1), "read the parser"),
        Step("Bash", {"command": "pytest -x tests/"}, _test_log(1, failing=True),
             "run the tests: a very long log"),
        Step("Grep", {"pattern": "def parse_", "path": "src"},
             "\n".join(f"src/parser.py:{2 * n + 1}:def parse_{n}(text):" for n in range(40)),
             "search"),
        Step("Edit", {"file_path": "src/parser.py", "old_string": "split", "new_string": "split_"},
             "The file src/parser.py has been updated.", "edit the parser"),
        Step("Read", {"file_path": "src/parser.py"}, _source_file(2), "re-read the edited file"),
        Step("Bash", {"command": "pytest -x tests/"}, _test_log(2, failing=True),
             "run the tests again"),
    ]
    for n in range(3, 14):
        steps.append(Step("Read", {"file_path": f"src/module_{n}.py"}, _source_file(n),
                          f"read module_{n}.py"))
        steps.append(Step("Bash", {"command": f"python -m mod{n} --check"},
                          "\n".join(f"check {n}.{k}: ok" for k in range(60)), "check it"))
    steps.append(Step("Read", {"file_path": "src/parser.py"}, _source_file(3),
                      "read the parser a third time"))
    steps.append(Step("Bash", {"command": "pytest tests/"}, _test_log(3, failing=False),
                      "the tests pass"))
    return steps


@dataclass
class Agent:
    """The scripted fake model's next answer, and the client-side history."""

    planned: Reply | None = None
    history: list[dict[str, Any]] = field(default_factory=list)

    def script(self, body: dict[str, Any], meta: RecordedRequest) -> Reply:
        """The fake provider's script: summaries for the summarizer, else the planned turn."""
        if self.planned is None or is_summarizer_request(body):
            return default_script(body, meta)
        return self.planned


async def _write_durable_fact(proxy_url: str, token: str, transcripts: Path) -> None:
    transcripts.mkdir(parents=True, exist_ok=True)
    event = {"sequence": 1, "session_id": SESSION_ID, "event_id": "evt-1",
             "type": "user_decision", "text": "Keep the public parse_* names unchanged."}
    (transcripts / f"{SESSION_ID}.jsonl").write_text(json.dumps(event) + "\n")
    state = {"facts": [{"fact_id": "keep-api",
                        "content": "The public parse_* names must not change.",
                        "source_pointer": f"transcript:{SESSION_ID}:1",
                        "last_confirmed_at": "2026-12-01T09:00:00Z"}],
             "pending_items": [{"item_id": "changelog", "description": "Add a changelog entry.",
                                "source_pointer": f"transcript:{SESSION_ID}:2",
                                "last_confirmed_at": "2026-12-01T09:05:00Z"}]}
    async with aiohttp.ClientSession() as http:
        async with http.put(f"{proxy_url}/admin/sessions/{SESSION_ID}/state", json=state,
                            headers={"Authorization": f"Bearer {token}"}) as response:
            response.raise_for_status()


def _audit_lines(logs: io.StringIO, event: str) -> list[dict[str, Any]]:
    # Every line is one JSON object: the demo's logging is configured with format json.
    records = map(json.loads, logs.getvalue().splitlines())
    return [record for record in records if record.get("event") == event]


async def _play(out: TextIO, client: anthropic.AsyncAnthropic, agent: Agent,
                upstream: FakeUpstream, plan: list[Step], seen_layers: set[str],
                headers: dict[str, str]) -> None:
    """Play ``plan`` through the proxy: one request per step, printing what compaction did."""
    for n, step in enumerate(plan, start=1):
        tool_id = f"toolu_demo_{len(agent.history):03d}"
        agent.planned = Reply.tool_call(step.name, step.tool_input, tool_use_id=tool_id,
                                        text=f"Next: {step.note}.")
        messages: Any = agent.history
        raw = await client.messages.with_raw_response.create(
            model=MODEL, max_tokens=1024, messages=messages, extra_headers=headers)
        message = await raw.parse()
        layers = raw.headers.get("x-compact-layers", "")
        seen_layers.update(filter(None, layers.split(",")))
        before = int(raw.headers.get("x-compact-tokens-before", "0"))
        after = int(raw.headers.get("x-compact-tokens-after", "0"))
        usage = message.usage
        counted = (usage.input_tokens + (usage.cache_read_input_tokens or 0)
                   + (usage.cache_creation_input_tokens or 0))
        upstream_messages = len(upstream.message_requests[-1].body["messages"])
        out.write(f"  #{n:02d}  {before:>6,} -> {after:>6,} tokens (provider counted "
                  f"{counted:>6,})   layers {layers or '-':<12} upstream saw "
                  f"{upstream_messages:>3} messages   ({step.note})\n")
        content = [b.model_dump(exclude_none=True) for b in message.content]
        agent.history.append({"role": "assistant", "content": content})
        agent.history.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tool_id, "content": step.output}]})


async def _run(out: TextIO) -> int:
    token = secrets.token_hex(16)
    os.environ[ADMIN_TOKEN_ENV] = token
    agent = Agent()
    # The provider counts with its own tokenizer (here 1.3 x characters / 4, +-10 % per
    # block): the proxy learns the ratio from its answers (compaction.calibration).
    upstream = FakeUpstream(script=agent.script, token_ratio=PROVIDER_TOKEN_RATIO,
                            token_noise=PROVIDER_TOKEN_NOISE)
    upstream_runner, upstream_url = await start_fake_upstream(upstream)
    with tempfile.TemporaryDirectory(prefix="compact-proxy-demo-") as tmp:
        root = Path(tmp)
        config = Config.from_mapping({
            "listen": {"host": "127.0.0.1", "port": 0},
            "upstream": {"base_url": upstream_url},
            "compaction": COMPACTION,
            "policies": {"roles": {"subagent": SUBAGENT_ROLE}},
            "store": {"path": str(root / "state.db")},
            "sources": {"transcript_root": str(root / "transcripts"),
                        "artifact_root": str(root / "artifacts")},
            "admin": {"token_env": ADMIN_TOKEN_ENV},
            "logging": {"format": "json", "level": "info"},
        })
        logs = io.StringIO()
        configure_logging(config.logging, stream=logs, secrets=[token])
        proxy_runner, proxy_url = await start_proxy(config)
        try:
            return await _session(out, agent, upstream, proxy_url, token, root, logs,
                                  proxy_runner.app[SERVICES].usage_ledger)
        finally:
            await proxy_runner.cleanup()
            await upstream_runner.cleanup()
            os.environ.pop(ADMIN_TOKEN_ENV, None)


async def _session(out: TextIO, agent: Agent, upstream: FakeUpstream, proxy_url: str,
                   token: str, root: Path, logs: io.StringIO,
                   ledger: BufferedLedger) -> int:
    out.write(f"fake provider (strict, offline) and compact-proxy on {proxy_url}\n")
    out.write(f"thresholds: soft {COMPACTION['soft_threshold_tokens']:,}  hard "
              f"{COMPACTION['hard_limit_tokens']:,}  L1 cuts tool results over "
              f"{COMPACTION['max_tool_result_tokens']:,} tokens\n")
    out.write(f"the provider counts tokens its own way ({PROVIDER_TOKEN_RATIO} x characters / 4): "
              "after its first answer the proxy's figures are calibrated to its counts\n")
    await _write_durable_fact(proxy_url, token, root / "transcripts")
    out.write("admin API: wrote 1 durable fact and 1 pending item for session "
              f"{SESSION_ID!r}\n\n")
    client = anthropic.AsyncAnthropic(base_url=proxy_url, api_key="demo-key-not-a-secret",
                                      max_retries=0,
                                      default_headers={"x-compact-session-id": SESSION_ID})
    seen_layers: set[str] = set()
    agent.history.append({"role": "user",
                          "content": "Fix the failing test in tests/test_parser.py."})
    try:
        out.write("main agent (role main: L1-L4, sticky):\n")
        await _play(out, client, agent, upstream, _plan(), seen_layers, {})
        last_system = upstream.message_requests[-1].body.get("system") or []
        durable = last_system[-1]["text"] if last_system else ""
        out.write("\ndurable context appended to system on every request (excerpt):\n")
        for line in durable.splitlines():
            if "source_status=" in line:
                out.write(f"    {line.strip()}\n")
        out.write(f"\na subagent ({SUBAGENT_HEADER} header, role subagent: L4 off, "
                  f"keep {SUBAGENT_ROLE['keep_recent_messages']} recent):\n")
        subagent = Agent(history=[{"role": "user", "content": "Summarise the docs chapters."}])
        upstream.script = subagent.script
        await _play(out, client, subagent, upstream, _subagent_plan(), seen_layers,
                    {SUBAGENT_HEADER: "agent-docs-1", "x-compact-session-id": "demo-subagent"})
        upstream.script = agent.script
        summaries = [r for r in upstream.message_requests
                     if r.body is not None and is_summarizer_request(r.body)]
        out.write(f"\nsummary calls made by L4: {len(summaries)}\n")

        out.write("\nthe user now pastes a 60,000-line build log into the chat:\n")
        agent.planned = Reply.text("Looking at the log.")
        paste = "\n".join(f"build step {k}: compiling unit {k} ... ok" for k in range(60_000))
        pasted: Any = [*agent.history[:-1],
                       {"role": "user", "content": [*agent.history[-1]["content"],
                                                    {"type": "text", "text": paste}]}]
        try:
            await client.messages.create(model=MODEL, max_tokens=1024, messages=pasted)
        except anthropic.BadRequestError as exc:
            error = exc.body.get("error", {}) if isinstance(exc.body, dict) else {}
            out.write(f"  blocked: 400 {error.get('message', '')}\n")
        else:
            out.write("  ERROR: the oversized request was not blocked\n")
            return 1
        blocked = _audit_lines(logs, "request_blocked")
        if not blocked:
            out.write("  ERROR: no request_blocked audit line was logged\n")
            return 1
        out.write("  audit log line:\n")
        out.write(f"    {json.dumps(blocked[-1], sort_keys=True)}\n")
        # What is always kept (the paste is the last message) is over the hard limit: no
        # summary can help, so none may be paid for.
        paid = sum(1 for r in upstream.message_requests
                   if r.body is not None and is_summarizer_request(r.body)) - len(summaries)
        out.write(f"  summary calls paid for it: {paid}\n")
        if paid:
            out.write("  ERROR: a summary was paid for a request that could not fit\n")
            return 1
    finally:
        await client.close()

    reported = await _write_report(out, ledger)
    if reported != len(summaries):
        out.write(f"ERROR: the report counts {reported} summary calls, the provider saw "
                  f"{len(summaries)}\n")
        return 1
    # A layer is at work when it saved tokens in a forwarded view, even where a later layer
    # took its change into a summary (a view's header names only what stayed in it).
    for line in _audit_lines(logs, "request_completed"):
        if line.get("outcome") == "forwarded":
            seen_layers.update(name for name, _, saved in map(
                lambda entry: str(entry).partition("="), line.get("saved", ()))
                if name.startswith("L") and saved.isdigit() and int(saved) > 0)
    missing = {"L1", "L2", "L3", "L4"} - seen_layers
    out.write(f"\nlayers seen at work: {', '.join(sorted(seen_layers)) or 'none'}\n")
    if missing:
        out.write(f"ERROR: layers never applied: {', '.join(sorted(missing))}\n")
        return 1
    return 0


async def _write_report(out: TextIO, ledger: BufferedLedger) -> int:
    """What ``compact-proxy report`` shows for the demo's store: billed tokens and the saving;
    returns the summary calls it counts."""
    rows = await ledger.usage_rows()  # written first: the proxy sums them between writes
    report = build_report(rows, Config.from_mapping({}, require_upstream=False).price_for)
    out.write("\nwhat the provider billed, and what it would have without the proxy "
              "(compact-proxy report, list prices):\n")
    for line in report.as_text().splitlines():
        out.write(f"  {line}\n")
    return report.total.entry.summary_calls


def main() -> int:
    """Run the demo; returns the exit code (0 when every layer and the block were shown)."""
    return asyncio.run(_run(sys.stdout))
