"""The real Claude Code CLI through the proxy: a long tool loop with thinking, compacted.

`claude -p` runs a whole task as one assistant turn. The strict fake provider answers like the
model without interleaved thinking: a thinking block on the turn's first message only, then one
``Bash`` call per step, whose large output Claude Code runs and sends back. With low thresholds
every layer runs inside that one turn; the provider refuses any view whose turn in progress no
longer starts with its thinking block (it did so on the third request before the fix). The CLI
must finish the task with every request accepted.

L4's summary call is forked from Claude Code's own request (``summary.mode: fork``), so it runs
with an API key and with a subscription login alike (``CLAUDE_CODE_OAUTH_TOKEN``: a bearer
``sk-ant-oat…`` the provider serves only with the OAuth beta and Claude Code's system prompt).

`bash .ci/run` installs the CLI (`npm install @anthropic-ai/claude-code` under `.ci/node`); the
test looks for it there, in ``$COMPACT_PROXY_CLAUDE`` or on ``PATH``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from proxy.fake_upstream import Reply, is_summarizer_request, thinking_block
from proxy.fake_upstream.records import RecordedRequest
from proxy.fake_upstream.replies import TokenRule
from proxy.fake_upstream.rules import check_claude_code_identity, check_oauth_beta
from proxy.fake_upstream.scripts import default_script
from tests.conftest import TEST_API_KEY, ProxyFactory, UpstreamServer, read_log

STEPS = 14
REPO = Path(__file__).resolve().parents[3]
#: A Claude Code subscription login (Pro/Max) as ``CLAUDE_CODE_OAUTH_TOKEN`` holds it.
OAUTH_TOKEN = "sk-ant-oat01-e2e-claude-code-login-0123456789abcdef"


def _claude() -> str | None:
    for candidate in (os.environ.get("COMPACT_PROXY_CLAUDE"),
                      str(REPO / ".ci" / "node" / "node_modules" / ".bin" / "claude"),
                      shutil.which("claude")):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


CLAUDE = _claude()
pytestmark = [pytest.mark.slow, pytest.mark.claude_code,
              pytest.mark.skipif(CLAUDE is None, reason="the Claude Code CLI is not installed "
                                 "(bash .ci/run installs it under .ci/node)")]


class ToolLoop:
    """The model's side of a ``STEPS``-step task: one Bash call per answer, thinking only on
    the turn's first answer (no interleaved thinking), then a closing text."""

    def __init__(self) -> None:
        self.steps = 0

    def __call__(self, body: dict[str, Any], meta: RecordedRequest) -> Reply:
        if is_summarizer_request(body):
            return default_script(body, meta)
        last = body["messages"][-1]
        in_loop = isinstance(last["content"], list) and any(
            b.get("type") == "tool_result" for b in last["content"])
        if self.steps >= STEPS:
            return Reply.text("All steps are done.")
        self.steps += 1
        blocks: list[dict[str, Any]] = [] if in_loop else [
            thinking_block("Plan: run the steps one by one and read each output.")]
        blocks.append({"type": "text", "text": f"Running step {self.steps}."})
        blocks.append({"type": "tool_use", "id": f"toolu_step_{self.steps:03d}", "name": "Bash",
                       "input": {"command": f"python3 -c \"print('step {self.steps} ' * 3000)\"",
                                 "description": "Print the step's output"}})
        return Reply(content=blocks, stop_reason="tool_use")


def run_tool_loop(proxy_factory: ProxyFactory, upstream_server: UpstreamServer,
                  proxy_log: Path, tmp_path: Path, credential: dict[str, str]
                  ) -> tuple[list[RecordedRequest], list[dict[str, Any]]]:
    """Run the ``STEPS``-step task with ``claude -p`` logged in by ``credential`` (its
    environment variables); the CLI must finish it with every request accepted. Returns the
    summary calls the provider got and the proxy's log lines of the session."""
    loop = ToolLoop()
    upstream_server.upstream.script = loop
    # The provider counts its own way; the proxy, as deployed, calibrates to it.
    upstream_server.upstream.token_rule = TokenRule(1.3, 0.1)
    proxy = proxy_factory({"compaction": {
        "soft_threshold_tokens": 60_000, "hard_limit_tokens": 150_000, "calibration": True,
        "max_tool_result_tokens": 2_000, "keep_recent_messages": 12, "summary_keep_recent": 2}})
    home = tmp_path / "home"
    home.mkdir()
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home),
           "ANTHROPIC_BASE_URL": proxy.base_url, **credential,
           "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    assert CLAUDE is not None
    done = subprocess.run(
        [CLAUDE, "-p", "Run the steps.", "--allowedTools", "Bash", "--max-turns", "40",
         "--output-format", "json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    outcome = json.loads(done.stdout)
    assert outcome.get("terminal_reason") == "completed", outcome
    assert loop.steps == STEPS

    recorded = upstream_server.upstream.message_requests
    requests = [r for r in recorded if r.body is not None and not is_summarizer_request(r.body)]
    assert len(requests) == STEPS + 1
    assert all(r.body.get("thinking", {}).get("type") in ("enabled", "adaptive")
               for r in requests)
    sessions = {r.headers.get("x-claude-code-session-id") for r in requests}
    assert len(sessions) == 1 and None not in sessions
    lines = [line for line in read_log(proxy_log) if line.get("session_id") in sessions]
    completed = [line for line in lines if line.get("event") == "request_completed"
                 and line.get("route") == "messages"]
    assert len(completed) == STEPS + 1
    assert {line["status"] for line in completed} == {200}
    layers = {layer for line in completed for layer in line["layers"]}
    assert {"L1", "L4"} <= layers  # compacted inside the one turn, summary included
    # Every summary call was answered (a refused one logs summary_failed, and no L4).
    calls = [r for r in recorded if r.body is not None and is_summarizer_request(r.body)]
    ready = [line for line in lines if line.get("event") == "summary_ready"
             and not line.get("cached")]
    assert calls and len(ready) == len(calls)
    assert not [line for line in lines if line.get("event") == "summary_failed"]
    for call in calls:  # forked: Claude Code's own request, without its thinking
        assert call.query_string == requests[0].query_string
        assert call.body["system"] == requests[0].body["system"]
        assert call.body["tools"] == requests[0].body["tools"]
        assert "thinking" not in call.body
    return calls, lines


def test_claude_code_finishes_a_long_thinking_tool_loop_through_the_proxy(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer, proxy_log: Path,
        tmp_path: Path) -> None:
    calls, _ = run_tool_loop(proxy_factory, upstream_server, proxy_log, tmp_path,
                             {"ANTHROPIC_API_KEY": TEST_API_KEY})
    assert all(call.api_key == TEST_API_KEY for call in calls)


def test_claude_code_with_a_subscription_login_gets_its_l4_summaries(
        proxy_factory: ProxyFactory, upstream_server: UpstreamServer, proxy_log: Path,
        tmp_path: Path) -> None:
    """``CLAUDE_CODE_OAUTH_TOKEN`` and no API key: the CLI sends ``Authorization: Bearer
    sk-ant-oat…``, the OAuth beta and its own system prompt; L4's forked summary calls carry
    all three and pass the provider's OAuth rules."""
    calls, _ = run_tool_loop(proxy_factory, upstream_server, proxy_log, tmp_path,
                             {"CLAUDE_CODE_OAUTH_TOKEN": OAUTH_TOKEN})
    for call in calls:
        authorization = call.headers["authorization"]
        assert authorization == f"Bearer {OAUTH_TOKEN}" and "x-api-key" not in call.headers
        assert "oauth-2025-04-20" in call.headers["anthropic-beta"]
        check_oauth_beta(authorization, call.headers["anthropic-beta"])
        check_claude_code_identity(authorization, call.body)


def test_claude_code_rehearses_a_tool_loop_offline_against_fake_upstream_tool_loop(
        proxy_factory: ProxyFactory, tmp_path: Path) -> None:
    """The README's offline rehearsal, as a user runs it: ``compact-proxy fake-upstream
    --script tool-loop --steps 4 --dump DIR``, the proxy in front, ``claude -p``. Claude Code
    runs four tool steps (its own Glob, Read and Bash) and finishes; the dump holds each
    request with the ``system`` the proxy forwarded."""
    from tests.proxy.cli.helpers import COMMAND, clean_env, free_port

    port, dump = free_port(), tmp_path / "dump"
    fake = subprocess.Popen(
        [*COMMAND, "fake-upstream", "--port", str(port), "--script", "tool-loop",
         "--steps", "4", "--dump", str(dump)],
        env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert fake.stdout is not None and "listening" in fake.stdout.readline()
        proxy = proxy_factory(upstream_url=f"http://127.0.0.1:{port}")
        work = tmp_path / "project"
        work.mkdir()
        (work / "notes.txt").write_text("rehearsal notes\n")
        home = tmp_path / "home"
        home.mkdir()
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home),
               "ANTHROPIC_BASE_URL": proxy.base_url, "ANTHROPIC_API_KEY": TEST_API_KEY,
               "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
        assert CLAUDE is not None
        done = subprocess.run(
            [CLAUDE, "-p", "Look around this project.", "--allowedTools", "Bash,Read,Glob",
             "--max-turns", "20", "--output-format", "json"],
            cwd=work, env=env, capture_output=True, text=True, timeout=300)
    finally:
        fake.terminate()
        fake.communicate(timeout=20)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    outcome = json.loads(done.stdout)
    assert "Tool loop finished: 4 tool steps" in outcome["result"], outcome
    bodies = [json.loads(p.read_text())["body"] for p in sorted(dump.glob("*-messages.json"))]
    last = bodies[-1]
    results = [b for m in last["messages"] if isinstance(m["content"], list)
               for b in m["content"] if b.get("type") == "tool_result"]
    used = [b["name"] for m in last["messages"] if isinstance(m["content"], list)
            for b in m["content"] if b.get("type") == "tool_use"]
    assert len(results) == 4 and {"Glob", "Read", "Bash"} <= set(used), used
    read = next(b for b in results if b["tool_use_id"] == "toolu_loop_002")
    assert "rehearsal notes" in json.dumps(read)  # Claude Code really read the file it found
    systems = sorted(dump.glob("*-messages-system.txt"))
    assert systems and "Claude Code" in systems[-1].read_text()
    # Claude Code's HEAD / at launch is the proxy's own: never forwarded.
    assert not list(dump.glob("*-root.json"))
