"""Tests for compact-proxy serve, fake-upstream, demo and main()'s exit codes."""

from __future__ import annotations

import importlib.util
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from proxy.cli.commands import main
from tests.proxy.cli.helpers import (
    BAD_KEY_LINE,
    COMMAND,
    EXAMPLE,
    bad_config,
    clean_env,
    free_port,
    run,
    shown_values,
)

pytestmark = pytest.mark.slow


# ------------------------------------------------------------------------------ serve


def test_serve_with_bad_config_exits_2_without_starting_anything(tmp_path: Path) -> None:
    """serve on a bad config prints one line, exits 2, and never imports or starts the app."""
    code = (
        "import json, sys\n"
        "from proxy.cli.commands import main\n"
        f"rc = main(['serve', '--config', {str(bad_config(tmp_path))!r}])\n"
        "print(json.dumps({'rc': rc, 'app': 'proxy.server.app' in sys.modules,"
        " 'aiohttp': 'aiohttp' in sys.modules}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=clean_env(),
        capture_output=True, text=True, timeout=60,
    )
    assert json.loads(result.stdout) == {"rc": 2, "app": False, "aiohttp": False}
    assert result.stderr.splitlines() == [BAD_KEY_LINE]
    assert not (tmp_path / "state").exists()
    assert not (tmp_path / "compact-proxy-state").exists()


def test_serve_console_script_with_bad_config_exits_2(tmp_path: Path) -> None:
    """The installed command exits 2 promptly (no server left running) on a bad config."""
    result = run(["serve", "--config", str(bad_config(tmp_path))], tmp_path, timeout=30)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [BAD_KEY_LINE]


def test_serve_without_base_url_exits_2(tmp_path: Path) -> None:
    """serve requires upstream.base_url."""
    path = tmp_path / "c.yaml"
    path.write_text("listen: {port: 0}\n")
    result = run(["serve", "--config", str(path)], tmp_path, timeout=30)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "config error: upstream.base_url: required (the provider, e.g. https://api.anthropic.com)"
    ]


@pytest.mark.skipif(
    importlib.util.find_spec("proxy.server.app") is None,
    reason="proxy.server.app is not written yet"
)
def test_serve_with_good_config_runs_the_proxy(tmp_path: Path) -> None:
    """serve on a valid config starts the proxy, which answers /healthz on the listen port."""
    port = free_port()
    state = tmp_path / "state"
    path = tmp_path / "c.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "listen": {"host": "127.0.0.1", "port": port},
                "upstream": {"base_url": "http://127.0.0.1:9"},
                "store": {"path": str(state / "state.db")},
                "sources": {
                    "transcript_root": str(state / "t"),
                    "artifact_root": str(state / "a"),
                },
            }
        )
    )
    proc = subprocess.Popen(
        [*COMMAND, "serve", "--config", str(path)], cwd=tmp_path, env=clean_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        body = None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    body = json.loads(r.read())
                    break
            except OSError:
                time.sleep(0.1)
        assert body == {"status": "ok", "store": "ok"}, f"serve exited with {proc.poll()}"
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=20)
    # The startup lines: where, in front of what, the thresholds per role, the export line.
    assert out.splitlines() == [
        f"compact-proxy listening on http://127.0.0.1:{port}, upstream http://127.0.0.1:9",
        "thresholds (tokens of the whole prompt: system + tools + messages): main soft "
        "80,000 / hard 120,000; subagent soft 80,000 / hard 120,000; summary_recovery soft "
        "80,000 / hard 120,000",
        "point Claude Code at it:",
        f"  export ANTHROPIC_BASE_URL=http://127.0.0.1:{port}",
    ]


# ------------------------------------------------------------------------------ other commands


def test_fake_upstream_command_serves_on_the_given_port(tmp_path: Path) -> None:
    """fake-upstream --host/--port starts the fake provider there, and stops on SIGTERM."""
    port = free_port()
    proc = subprocess.Popen(
        [*COMMAND, "fake-upstream", "--host", "127.0.0.1", "--port", str(port)],
        cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == f"fake upstream listening on http://127.0.0.1:{port}"
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
    assert proc.returncode == 0


def test_demo_command_runs_offline_and_exits_0(tmp_path: Path) -> None:
    """demo shows every layer, the durable block and a blocked request, offline, exit 0."""
    result = run(["demo"], tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    for layer in ("L1", "L2", "L3", "L4"):
        assert f"layers {layer}" in out or f",{layer}" in out
    assert "layers seen at work: L1, L2, L3, L4" in out
    assert "source_status=available" in out and "source_status=missing" in out
    assert "blocked: 400 prompt is too long:" in out
    audit = json.loads(out.split("audit log line:", 1)[1].strip().splitlines()[0])
    assert audit["event"] == "request_blocked"
    assert audit["reason"] == "MessageViewLimitExceeded"
    assert audit["tokens_after"] >= audit["hard_limit"]


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["--help"], 0),
        ([], 2),
        (["bogus"], 2),
        (["fake-upstream", "--port", "eighty"], 2),
        (["serve", "--unknown-flag"], 2),
    ],
)
def test_main_returns_the_exit_code(
    argv: list[str], code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """main() returns argparse's exit code instead of raising SystemExit."""
    assert main(argv) == code


def test_main_check_config_in_process(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """main(['check-config', ...]) returns 0/2 and writes YAML or the one error line."""
    assert main(["check-config", "--config", str(EXAMPLE), "--show"]) == 0
    out = capsys.readouterr()
    assert shown_values(out.out)["upstream"]["base_url"] == "https://api.anthropic.com"
    assert main(["check-config", "--config", str(bad_config(tmp_path))]) == 2
    out = capsys.readouterr()
    assert out.err.splitlines() == [BAD_KEY_LINE] and out.out == ""
