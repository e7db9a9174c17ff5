"""Probe recall: facts planted early in a long session, asked about after it was compacted.

A coding session of ``--turns`` requests plants five facts in its first turns — an identifier
(in a tool result), a decision (the assistant's), a failed approach (a command that failed and
why), an instruction the user typed, and the path of an edited file — then goes on with long
tool outputs until the proxy has compacted the start away. Each request is sent through the
proxy as a client would; then one probe per fact is asked (``PROBE: <key>`` and a question),
once with the whole history sent to the provider directly and once through the proxy.

Offline (the default) the provider is the strict fake, which answers a probe correctly exactly
when the fact's text is in the view it received (``proxy/fake_upstream/probes.py``) and whose
summaries carry no facts: the figure is what the view keeps verbatim (a lower bound for a real
model). With ``--base-url`` and ``ANTHROPIC_API_KEY`` the same is asked of a real provider,
with and without the proxy, and a probe counts when the answer holds the expected text.

    python -m bench.probes
    python -m bench.probes --turns 60 --soft 8000
    ANTHROPIC_API_KEY=... python -m bench.probes --base-url https://api.anthropic.com \
        --model claude-haiku-4-5
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic

from proxy.config import Config
from proxy.fake_upstream import FakeUpstream, RecordedRequest, Reply, start_fake_upstream
from proxy.fake_upstream.scripts import default_script
from proxy.server.app import start_proxy
from proxy.telemetry.logs import configure_logging


@dataclass(frozen=True)
class Fact:
    """One planted fact: its kind, the probe's key and question, the text a right answer
    holds."""

    kind: str
    key: str
    question: str
    expected: str


FACTS = (
    Fact("identifier", "staging database is named",
         "What is the staging database named?", "pg-staging-7f3a"),
    Fact("decision", "instead of pydantic for the wire models",
         "Which library did we choose for the wire models, and why?", "msgspec"),
    Fact("failed approach", "Pinning urllib3",
         "What happened when we tried pinning urllib3, and why?", "requires urllib3 2"),
    Fact("user instruction", "Never push to the main branch",
         "Where must changes be pushed?", "fix/parser-offsets"),
    Fact("file path", "src/parser/offsets_",
         "Which file holds the offsets fix?", "offsets_v2.py"),
)


def _call(n: int, name: str, tool_input: dict[str, Any], output: str,
          note: str) -> list[dict[str, Any]]:
    tool_id = f"toolu_{n:05d}"
    return [{"role": "assistant", "content": [{"type": "text", "text": note},
                                              {"type": "tool_use", "id": tool_id, "name": name,
                                               "input": tool_input}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_id,
                                          "content": output}]}]


def session(turns: int) -> list[list[dict[str, Any]]]:
    """The successive ``messages`` of the session (each a request), the facts planted first."""
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "Fix the off-by-one in the parser's offsets."}]
    steps: list[list[dict[str, Any]]] = [
        _call(0, "Read", {"file_path": "/repo/config/staging.py"},
              "# staging\nPOOL = 4\n# The staging database is named pg-staging-7f3a.\n",
              "Reading the staging config."),
        _call(1, "Bash", {"command": "pip install 'urllib3<2'"},
              "Exit code 1\nERROR: anthropic requires urllib3 2; urllib3 1.26 conflicts.",
              "Trying an older urllib3."),
        [{"role": "assistant", "content": "Pinning urllib3 to 1.26 failed: the SDK requires "
                                          "urllib3 2. Decision: msgspec instead of pydantic "
                                          "for the wire models, because it is faster."},
         {"role": "user", "content": "Never push to the main branch; push to "
                                     "fix/parser-offsets and open a pull request."}],
        _call(2, "Edit", {"file_path": "/repo/src/parser/offsets_v2.py",
                          "old_string": "i + 1", "new_string": "i"},
              "The file has been updated.", "Fixing the offset."),
    ]
    requests: list[list[dict[str, Any]]] = []
    for step in steps:
        history = [*history, *step]
        if history[-1]["role"] == "user":
            requests.append(history)
    for n in range(3, turns):
        log = "".join(f"tests/test_parser.py::test_case_{n}_{i} PASSED\n" for i in range(250))
        history = [*history, *_call(n, "Bash", {"command": f"pytest -k case{n}"}, log,
                                    f"Running test batch {n}.")]
        requests.append(history)
    return requests


def probe_messages(history: list[dict[str, Any]], fact: Fact) -> list[dict[str, Any]]:
    """``history`` closed by the assistant, then the probe for ``fact``."""
    return [*history, {"role": "assistant", "content": "All batches ran."},
            {"role": "user", "content": f"PROBE: {fact.key}\n{fact.question} Answer in one "
                                        "sentence from what you know of this session."}]


async def ask(client: anthropic.AsyncAnthropic, model: str,
              messages: list[dict[str, Any]]) -> str:
    reply = await client.messages.create(model=model, max_tokens=200,
                                         messages=messages)  # type: ignore[arg-type]
    return "".join(getattr(b, "text", "") for b in reply.content)


@dataclass(frozen=True)
class Run:
    """One way of asking: how many probes came back right, by kind."""

    way: str
    right: dict[str, bool]
    summary_calls: int = 0


async def play(base_url: str, api_key: str, model: str, turns: int, way: str,
               headers: dict[str, str] | None = None) -> Run:
    """Send the session request by request to ``base_url``, then every probe."""
    requests = session(turns)
    async with anthropic.AsyncAnthropic(base_url=base_url, api_key=api_key, max_retries=2,
                                        default_headers=headers or {}) as client:
        for messages in requests:
            await ask(client, model, messages)
        right = {}
        for fact in FACTS:
            answer = await ask(client, model, probe_messages(requests[-1], fact))
            right[fact.kind] = fact.expected in answer
    return Run(way, right)


def proxy_config(upstream: str, root: Path, soft: int, *, keep: bool = True) -> Config:
    """The proxy's configuration for the run: the given soft threshold; ``keep`` False sets
    both retention budgets to 0 (the proxy as it was before issue #34)."""
    budgets = {} if keep else {"user_text_budget_tokens": 0, "artifact_trail_budget_tokens": 0}
    return Config.from_mapping({
        "listen": {"host": "127.0.0.1", "port": 0},
        "upstream": {"base_url": upstream},
        "compaction": {"soft_threshold_tokens": soft, "hard_limit_tokens": soft * 3,
                       "max_tool_result_tokens": max(200, soft // 10),
                       "keep_recent_messages": 24, "summary_keep_recent": 4, **budgets},
        "store": {"path": str(root / "state.db")},
        "logging": {"level": "warning"},
    })


async def measure(turns: int, soft: int, base_url: str | None = None,
                  api_key: str = "bench-key-offline", model: str = "claude-sonnet-4-5",
                  ) -> list[Run]:
    """Straight to the provider, then through a proxy started here: with both retention
    budgets at 0 (as before issue #34), and as configured by default."""
    upstream_runner = None
    fake: FakeUpstream | None = None
    if base_url is None:
        def script(body: dict[str, Any], meta: RecordedRequest) -> Reply:
            return default_script(body, meta)

        fake = FakeUpstream(script=script)
        upstream_runner, base_url = await start_fake_upstream(fake)
    try:
        runs = [await play(base_url, api_key, model, turns, "direct")]
        for keep, way in ((False, "proxy, budgets 0"), (True, "through the proxy")):
            runs.append(await _proxied(base_url, api_key, model, turns, soft, keep, way, fake))
    finally:
        if upstream_runner is not None:
            await upstream_runner.cleanup()
    return runs


async def _proxied(base_url: str, api_key: str, model: str, turns: int, soft: int, keep: bool,
                   way: str, fake: FakeUpstream | None) -> Run:
    with tempfile.TemporaryDirectory(prefix="bench-probes-") as tmp:
        config = proxy_config(base_url, Path(tmp), soft, keep=keep)
        configure_logging(config.logging, stream=io.StringIO())  # (the table only)
        runner, proxy_url = await start_proxy(config)
        try:
            before = len(fake.message_requests) if fake else 0
            run = await play(proxy_url, api_key, model, turns, way,
                             {"x-compact-session-id": f"bench-probes-{keep}"})
        finally:
            await runner.cleanup()
    if fake is None:
        return run
    calls = sum(1 for r in fake.message_requests[before:]
                if "compact-proxy-summarizer" in str(r.body))
    return Run(run.way, run.right, calls)


def format_runs(runs: list[Run]) -> str:
    """The runs side by side: one column per fact kind, then the total."""
    kinds = [fact.kind for fact in FACTS]
    lines = [f"{'way':<20}" + "".join(f"{k:>18}" for k in kinds)
             + f"{'recall':>9}{'summaries':>11}"]
    for run in runs:
        cells = "".join(f"{('yes' if run.right[k] else 'no'):>18}" for k in kinds)
        total = sum(run.right.values())
        lines.append(f"{run.way:<20}{cells}{f'{total}/{len(kinds)}':>9}{run.summary_calls:>11}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--soft", type=int, default=6_000, help="the proxy's soft threshold")
    parser.add_argument("--base-url", default=None, help="a real provider (needs an API key)")
    parser.add_argument("--model", default="claude-sonnet-4-5")
    args = parser.parse_args(argv)
    key = "bench-key-offline"
    if args.base_url is not None:
        key = os.environ.get("ANTHROPIC_API_KEY", "")
        if not key:
            parser.error("--base-url needs ANTHROPIC_API_KEY in the environment")
    runs = asyncio.run(measure(args.turns, args.soft, args.base_url, key, args.model))
    where = "the strict fake (offline)" if args.base_url is None else args.base_url
    print(f"{args.turns} requests, 5 facts planted in the first 4; provider: {where}; "
          f"proxy soft threshold {args.soft:,} tokens")
    print(format_runs(runs))


if __name__ == "__main__":
    main()
