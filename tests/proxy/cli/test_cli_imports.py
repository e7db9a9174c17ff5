"""What a process imports: the CLI's store commands read the store without importing the
request path, and a serving proxy imports the anthropic SDK (a second of every process's
start) only for its first summary call."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

_PROBE = """
import sys
from proxy.cli.commands import main
code = main(["session", "nosuch", "--config", sys.argv[1]])
print(code, "anthropic" in sys.modules, "proxy.http.errors" in sys.modules)
"""


def test_the_session_command_does_not_import_the_sdk(tmp_path: Path) -> None:
    """``session`` answers (exit 1, no such session) with neither the anthropic SDK nor the
    request path's error module imported."""
    config = tmp_path / "config.yaml"
    config.write_text("upstream: {base_url: 'https://api.anthropic.com'}\n"
                      f"store: {{path: '{tmp_path / 'state' / 'state.db'}'}}\n",
                      encoding="utf-8")
    result = subprocess.run([sys.executable, "-c", _PROBE, str(config)], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.stdout.split() == ["1", "False", "False"], result.stderr


_SERVE_PROBE = """
import asyncio, sys, tempfile
from pathlib import Path

import aiohttp

import compactor
from proxy.server.app import start_proxy
from proxy.config import Config, SummaryConfig
from proxy.fake_upstream import FakeUpstream, start_fake_upstream
from proxy.summary.summarizer import CallerCredentials, ProviderSummarizer


async def main() -> None:
    upstream_runner, upstream_url = await start_fake_upstream(FakeUpstream())
    state = Path(tempfile.mkdtemp(dir=sys.argv[1]))
    config = Config.from_mapping({
        "listen": {"host": "127.0.0.1", "port": 0},
        "upstream": {"base_url": upstream_url},
        "store": {"path": str(state / "state.db")},
        "sources": {"transcript_root": str(state), "artifact_root": str(state)}})
    runner, url = await start_proxy(config)
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/messages", json={
                "model": "claude-sonnet-4-5", "max_tokens": 16,
                "messages": [{"role": "user", "content": "hi"}]},
                headers={"x-api-key": "sk-ant-probe", "anthropic-version": "2023-06-01"}) as r:
            print("served", r.status, "anthropic" in sys.modules)
    provider = ProviderSummarizer(SummaryConfig(mode="separate", max_retries=0), upstream_url,
                                  None)
    result = await provider.summarize(compactor.SummaryRequest('[{"role":"user"}]', "k", 1),
                                      CallerCredentials(x_api_key="sk-ant-probe"))
    print("summarized", result.outcome, "anthropic" in sys.modules)
    await provider.close()
    await runner.cleanup()
    await upstream_runner.cleanup()

asyncio.run(main())
"""


def test_a_serving_proxy_imports_the_sdk_for_its_first_summary_call_only(
        tmp_path: Path) -> None:
    """A proxy starts and forwards a request without the anthropic SDK (a second of every
    process's start); the first summary call imports it, and the call is made."""
    result = subprocess.run([sys.executable, "-c", _SERVE_PROBE, str(tmp_path)], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    lines = [line.split() for line in result.stdout.splitlines()
             if line.startswith(("served", "summarized"))]
    assert lines == [["served", "200", "False"], ["summarized", "ok", "True"]], result.stderr
