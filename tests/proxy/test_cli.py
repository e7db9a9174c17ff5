"""Tests for proxy.cli: the compact-proxy command, run as a real process where it matters."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from compactor import DurableContextState
from proxy.cli import main
from proxy.config import load_config
from proxy.http.tenants import TenantScope
from proxy.state.store import SQLiteStateStore

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "config.example.yaml"
_SCRIPT = shutil.which("compact-proxy") or (
    str(Path(sys.executable).with_name("compact-proxy"))
    if Path(sys.executable).with_name("compact-proxy").exists()
    else None
)
COMMAND = [_SCRIPT] if _SCRIPT else [sys.executable, "-m", "proxy.cli"]
BAD_KEY_LINE = (
    "config error: compaction.soft_treshold_tokens: unknown key "
    "(did you mean 'soft_threshold_tokens'?)"
)


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        # No key and no base URL from the developer's shell: the commands must work without.
        if k not in ("COMPACT_PROXY_CONFIG", "COMPACT_PROXY_ADMIN_TOKEN")
        and not k.startswith("ANTHROPIC_")
    }
    env.update(extra)
    return env


def run(
    args: list[str], cwd: Path, timeout: float = 60, *, stdin: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMMAND, *args],
        cwd=cwd,
        env=clean_env(**env),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def bad_config(tmp_path: Path) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "upstream: {base_url: 'https://api.anthropic.com'}\n"
        f"store: {{path: '{tmp_path / 'state' / 'state.db'}'}}\n"
        "compaction:\n  soft_treshold_tokens: 1000\n",
        encoding="utf-8",
    )
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ------------------------------------------------------------------------------ check-config


def test_check_config_accepts_the_example_and_prints_effective_values(tmp_path: Path) -> None:
    """check-config on config.example.yaml exits 0 and prints the effective values as YAML."""
    result = run(["check-config", "--config", str(EXAMPLE)], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert yaml.safe_load(result.stdout) == load_config(EXAMPLE).as_dict()


def test_check_config_prints_dataclass_values_not_raw_yaml(tmp_path: Path) -> None:
    """Defaults the file leaves out and normalized values appear in the output."""
    path = tmp_path / "c.yaml"
    path.write_text(
        "upstream: {base_url: 'http://127.0.0.1:9', connect_timeout_s: 3}\n"
        "session: {header: X-Sess}\n",
        encoding="utf-8",
    )
    result = run(["check-config", "--config", str(path)], tmp_path)
    assert result.returncode == 0, result.stderr
    printed = yaml.safe_load(result.stdout)
    assert printed["upstream"]["connect_timeout_s"] == 3.0
    assert printed["session"]["header"] == "x-sess"
    assert printed["compaction"]["hard_limit_tokens"] == 120_000
    assert printed["policies"]["roles"]["summary_recovery"]["summary_enabled"] is False


def test_check_config_bad_key_exits_2_with_exactly_one_line(tmp_path: Path) -> None:
    """A misspelt key: exit 2, one stderr line naming the key, nothing on stdout."""
    result = run(["check-config", "--config", str(bad_config(tmp_path))], tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [BAD_KEY_LINE]


def test_check_config_reads_the_path_from_the_env_var(tmp_path: Path) -> None:
    """Without --config, COMPACT_PROXY_CONFIG names the file."""
    path = tmp_path / "c.yaml"
    path.write_text("upstream: {base_url: 'http://127.0.0.1:9'}\nlisten: {port: 4321}\n")
    result = run(["check-config"], tmp_path, COMPACT_PROXY_CONFIG=str(path))
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["listen"]["port"] == 4321


def test_check_config_without_any_config_exits_2(tmp_path: Path) -> None:
    """Neither --config nor COMPACT_PROXY_CONFIG: one line saying how to give one, exit 2."""
    result = run(["check-config"], tmp_path)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "COMPACT_PROXY_CONFIG" in lines[0]


def test_check_config_shows_secrets_only_by_env_var_name(tmp_path: Path) -> None:
    """The admin token and summary key values never appear; their variable names do."""
    path = tmp_path / "c.yaml"
    path.write_text(
        "upstream: {base_url: 'http://127.0.0.1:9'}\nsummary: {api_key_env: SUMMARY_KEY}\n"
    )
    result = run(
        ["check-config", "--config", str(path)],
        tmp_path,
        COMPACT_PROXY_ADMIN_TOKEN="admin-s3cret",
        SUMMARY_KEY="sk-s3cret",
    )
    assert result.returncode == 0, result.stderr
    assert "s3cret" not in result.stdout
    assert "COMPACT_PROXY_ADMIN_TOKEN" in result.stdout and "SUMMARY_KEY" in result.stdout


def test_python_dash_m_runs_the_cli(tmp_path: Path) -> None:
    """`python -m proxy.cli` exits with main()'s code."""
    ok = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "check-config", "--config", str(EXAMPLE)],
        cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=60,
    )
    bad = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "check-config", "--config", str(bad_config(tmp_path))],
        cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=60,
    )
    assert (ok.returncode, bad.returncode) == (0, 2)


# ------------------------------------------------------------------------------ serve


def test_serve_with_bad_config_exits_2_without_starting_anything(tmp_path: Path) -> None:
    """serve on a bad config prints one line, exits 2, and never imports or starts the app."""
    code = (
        "import json, sys\n"
        "from proxy.cli import main\n"
        f"rc = main(['serve', '--config', {str(bad_config(tmp_path))!r}])\n"
        "print(json.dumps({'rc': rc, 'app': 'proxy.app' in sys.modules,"
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
    importlib.util.find_spec("proxy.app") is None, reason="proxy.app is not written yet"
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
        assert body == {"status": "ok"}, f"serve exited with {proc.poll()}"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=20)


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
    assert main(["check-config", "--config", str(EXAMPLE)]) == 0
    out = capsys.readouterr()
    assert yaml.safe_load(out.out)["upstream"]["base_url"] == "https://api.anthropic.com"
    assert main(["check-config", "--config", str(bad_config(tmp_path))]) == 2
    out = capsys.readouterr()
    assert out.err.splitlines() == [BAD_KEY_LINE] and out.out == ""


# ------------------------------------------------------------------------------ tenant-id

SECRET = "s3cret-for-tenants"
CREDENTIAL = "sk-ant-api03-example-credential"


def scoped_config(tmp_path: Path, scope: str | None) -> Path:
    path = tmp_path / "scoped.yaml"
    session = f"session: {{scope: '{scope}'}}\n" if scope else ""
    path.write_text(
        "upstream: {base_url: 'https://api.anthropic.com'}\n"
        f"store: {{path: '{tmp_path / 'state' / 'state.db'}'}}\n" + session,
        encoding="utf-8",
    )
    return path


def test_tenant_id_prints_the_credential_tenant(tmp_path: Path) -> None:
    """scope credential: the HMAC tenant of the credential on stdin, as the proxy keys it."""
    config = load_config(scoped_config(tmp_path, "credential"))
    expected = TenantScope.from_config(
        config.session, {config.session.secret_env: SECRET}).tenant_of({"x-api-key": CREDENTIAL})
    result = run(["tenant-id", "--config", str(scoped_config(tmp_path, "credential"))],
                 tmp_path, stdin=CREDENTIAL + "\n", COMPACT_PROXY_SESSION_SECRET=SECRET)
    assert (result.returncode, result.stdout, result.stderr) == (0, expected + "\n", "")
    assert CREDENTIAL not in result.stdout


def test_tenant_id_prints_the_header_tenant(tmp_path: Path) -> None:
    """scope header:<name>: the tenant of the header value on stdin."""
    path = scoped_config(tmp_path, "header:x-forwarded-user")
    config = load_config(path)
    expected = TenantScope.from_config(config.session, {}).tenant_of(
        {"x-forwarded-user": "alice@example.com"})
    result = run(["tenant-id", "--config", str(path)], tmp_path,
                 stdin="  alice@example.com  \n")
    assert (result.returncode, result.stdout) == (0, expected + "\n")
    assert expected.startswith("h")


def test_tenant_id_for_scope_none_prints_none(tmp_path: Path) -> None:
    """Without a scope (loopback) every request is tenant none."""
    result = run(["tenant-id", "--config", str(scoped_config(tmp_path, None))], tmp_path,
                 stdin="anything\n")
    assert (result.returncode, result.stdout) == (0, "none\n")


def test_tenant_id_without_the_secret_exits_2_with_one_line(tmp_path: Path) -> None:
    """scope credential with the secret variable unset: the config error, one line, exit 2."""
    result = run(["tenant-id", "--config", str(scoped_config(tmp_path, "credential"))],
                 tmp_path, stdin=CREDENTIAL + "\n")
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1
    assert "session.secret_env" in result.stderr and CREDENTIAL not in result.stderr


def test_tenant_id_with_nothing_on_stdin_exits_2(tmp_path: Path) -> None:
    """An empty line is no credential."""
    result = run(["tenant-id", "--config", str(scoped_config(tmp_path, "credential"))],
                 tmp_path, stdin="\n", COMPACT_PROXY_SESSION_SECRET=SECRET)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1


# ------------------------------------------------------------------------------ move-session

TENANT = "t0123456789abcdef"


def _state(content: str) -> DurableContextState:
    return DurableContextState.from_dict({
        "facts": [{"fact_id": "f1", "content": content, "source_pointer": "transcript:s:1",
                   "last_confirmed_at": "2025-03-01T12:30:00+00:00"}],
        "pending_items": [], "retrieval_evidence": []})


def _put(db: Path, key: str, content: str, checkpoint: bytes | None = None) -> None:
    async def go() -> None:
        store = await SQLiteStateStore(db).open()
        try:
            await store.put_state(key, _state(content), None)
            if checkpoint is not None:
                await store.put_record(key, "checkpoint:main:abc", checkpoint)
        finally:
            await store.close()

    asyncio.run(go())


def _read(db: Path, key: str) -> tuple[str | None, bytes | None]:
    async def go() -> tuple[str | None, bytes | None]:
        store = await SQLiteStateStore(db).open()
        try:
            stored = await store.get_state(key)
            record = await store.get_record(key, "checkpoint:main:abc")
        finally:
            await store.close()
        return (stored.state.facts[0].content if stored else None), record

    return asyncio.run(go())


def test_move_session_moves_state_from_none_to_a_tenant_and_back(tmp_path: Path) -> None:
    """move-session takes the state from scoped_key(from, sid) to scoped_key(to, sid)."""
    path = scoped_config(tmp_path, None)
    db = tmp_path / "state" / "state.db"
    _put(db, "sess-1", "kept fact", checkpoint=b"ckpt")
    result = run(["move-session", "--config", str(path), "--session", "sess-1",
                  "--to-tenant", TENANT], tmp_path)
    assert result.returncode == 0, result.stderr
    assert TENANT in result.stdout and "sess-1" in result.stdout
    assert "checkpoint" in result.stdout  # says what was not moved
    assert _read(db, f"{TENANT}/sess-1")[0] == "kept fact"
    assert _read(db, "sess-1")[0] is None

    result = run(["move-session", "--config", str(path), "--session", "sess-1",
                  "--from-tenant", TENANT, "--to-tenant", "none"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert _read(db, "sess-1")[0] == "kept fact"
    assert _read(db, f"{TENANT}/sess-1")[0] is None


def test_move_session_refuses_when_the_target_has_state(tmp_path: Path) -> None:
    """Exit 2 with one line, and both states stay as they were."""
    path = scoped_config(tmp_path, None)
    db = tmp_path / "state" / "state.db"
    _put(db, "sess-1", "source")
    _put(db, f"{TENANT}/sess-1", "target")
    result = run(["move-session", "--config", str(path), "--session", "sess-1",
                  "--to-tenant", TENANT], tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and "already" in result.stderr
    assert _read(db, "sess-1")[0] == "source"
    assert _read(db, f"{TENANT}/sess-1")[0] == "target"


@pytest.mark.parametrize(
    "args",
    [["--session", "sess-1", "--to-tenant", "sk-ant-secret"],
     ["--session", "sess-1", "--to-tenant", TENANT, "--from-tenant", "bogus"],
     ["--session", "a..b", "--to-tenant", TENANT],
     ["--session", "sess-1", "--to-tenant", "none"],
     ["--session", "missing", "--to-tenant", TENANT]],
    ids=["bad-to", "bad-from", "bad-session", "same-tenant", "no-state"],
)
def test_move_session_refusals_exit_2_with_one_line(tmp_path: Path, args: list[str]) -> None:
    """Bad tenants, a bad session id, a move onto itself, nothing to move: one line, exit 2,
    and the store is unchanged."""
    path = scoped_config(tmp_path, None)
    db = tmp_path / "state" / "state.db"
    _put(db, "sess-1", "source")
    result = run(["move-session", "--config", str(path), *args], tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1
    assert "sk-ant-secret" not in result.stderr
    assert _read(db, "sess-1")[0] == "source"


def test_move_session_with_a_bad_config_exits_2(tmp_path: Path) -> None:
    result = run(["move-session", "--config", str(bad_config(tmp_path)), "--session", "s",
                  "--to-tenant", TENANT], tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [BAD_KEY_LINE]
