"""Tests for proxy.cli.commands: the compact-proxy command, run as a real process where it
matters."""

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
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest
import redis.asyncio as aioredis
import yaml

from compactor import DurableContextState
from proxy.accounting.usage import UsageEntry
from proxy.audit.log import LayerSaving, RequestEntry, StateChange
from proxy.cli.commands import main
from proxy.config import load_config
from proxy.http.tenants import TenantScope
from proxy.store import RedisStateStore, SQLiteStateStore, StoreBackend
from tests.redis_server import RedisServer, RedisServerUnavailable
from tests.servers import started

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
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


def shown_values(stdout: str) -> object:
    """The effective values ``check-config --show`` prints as YAML before its OK line."""
    *values, last = stdout.splitlines()
    assert last.startswith("OK: "), stdout[-300:]
    return yaml.safe_load("\n".join(values))


def test_check_config_prints_one_ok_line(tmp_path: Path) -> None:
    """check-config on config.example.yaml exits 0 with one OK line: where it listens, the
    upstream, the store and main's thresholds, and the flag that prints every value."""
    result = run(["check-config", "--config", str(EXAMPLE)], tmp_path)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    assert result.stdout.splitlines() == [
        "OK: listen http://127.0.0.1:8787, upstream https://api.anthropic.com, store sqlite "
        "./compact-proxy-state/state.db, main soft 80,000 / hard 120,000 tokens "
        "(--show prints every value)"]


def test_check_config_show_prints_effective_values_then_ok(tmp_path: Path) -> None:
    """check-config --show prints the effective values as YAML, then the OK line."""
    result = run(["check-config", "--config", str(EXAMPLE), "--show"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert shown_values(result.stdout) == load_config(EXAMPLE).as_dict()
    assert result.stdout.splitlines()[-1].endswith("hard 120,000 tokens")


def test_check_config_ok_line_masks_a_redis_password(tmp_path: Path) -> None:
    """The OK line names the Redis store by its URL with the password as ***; the store is
    reached with it (a real Redis that requires it)."""
    with started(RedisServer(extra_args=("--requirepass", "hunter2-pw")),
                 RedisServerUnavailable) as server:
        path = tmp_path / "c.yaml"
        url = f"redis://:hunter2-pw@127.0.0.1:{server.port}/0"
        path.write_text("upstream: {base_url: 'http://127.0.0.1:9'}\n"
                        f"store: {{backend: redis, url: '{url}'}}\n"
                        "compaction: {soft_threshold_tokens: 60000, hard_limit_tokens: 90000}\n")
        result = run(["check-config", "--config", str(path)], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "OK: listen http://127.0.0.1:8787, upstream http://127.0.0.1:9, store redis "
        f"redis://:***@127.0.0.1:{server.port}/0, main soft 60,000 / hard 90,000 tokens "
        "(--show prints every value)"]


def test_check_config_fails_on_a_store_serve_could_not_open(tmp_path: Path) -> None:
    """A Redis URL nobody answers, a SQLite path under a read-only folder: exit 2, one line
    on stderr naming the key, no OK line."""
    port = free_port()
    redis = tmp_path / "redis.yaml"
    redis.write_text("upstream: {base_url: 'http://127.0.0.1:9'}\n"
                     f"store: {{backend: redis, url: 'redis://:pw@127.0.0.1:{port}/0'}}\n")
    result = run(["check-config", "--config", str(redis)], tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    (line,) = result.stderr.splitlines()
    assert line.startswith("config error: store.url: cannot open the state store: ")
    assert f"127.0.0.1:{port}" in line and ":pw@" not in line
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    sqlite = tmp_path / "sqlite.yaml"
    sqlite.write_text("upstream: {base_url: 'http://127.0.0.1:9'}\n"
                      f"store: {{path: '{locked}/state/state.db'}}\n")
    result = run(["check-config", "--config", str(sqlite)], tmp_path)
    if os.geteuid() != 0:  # root writes anywhere
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.strip() == (f"config error: store.path: cannot open the state "
                                         f"store: {locked} is not writable")
    assert not (locked / "state").exists()  # check-config never creates the store


def test_check_config_prints_dataclass_values_not_raw_yaml(tmp_path: Path) -> None:
    """Defaults the file leaves out and normalized values appear in the output."""
    path = tmp_path / "c.yaml"
    path.write_text(
        "upstream: {base_url: 'http://127.0.0.1:9', connect_timeout_s: 3}\n"
        "session: {header: X-Sess}\n",
        encoding="utf-8",
    )
    result = run(["check-config", "--config", str(path), "--show"], tmp_path)
    assert result.returncode == 0, result.stderr
    printed = shown_values(result.stdout)
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
    assert result.stdout.startswith("OK: listen http://127.0.0.1:4321, ")


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
        ["check-config", "--config", str(path), "--show"],
        tmp_path,
        COMPACT_PROXY_ADMIN_TOKEN="admin-s3cret-0123456789abcdef0123456789",
        SUMMARY_KEY="sk-s3cret",
    )
    assert result.returncode == 0, result.stderr
    assert "s3cret" not in result.stdout
    assert "COMPACT_PROXY_ADMIN_TOKEN" in result.stdout and "SUMMARY_KEY" in result.stdout


SHORT_TOKEN_LINE = (
    "config error: admin.token_env: the environment variable COMPACT_PROXY_ADMIN_TOKEN holds a "
    "token of 1 characters; at least 32 are required (admin.min_token_length), e.g. "
    "`openssl rand -hex 32`"
)


@pytest.mark.parametrize("command", ["check-config", "serve"])
def test_a_short_admin_token_is_a_config_error(tmp_path: Path, command: str) -> None:
    """``COMPACT_PROXY_ADMIN_TOKEN=x``: one line naming the variable and the minimum, exit 2,
    nothing served; 32 characters are accepted."""
    path = tmp_path / "c.yaml"
    path.write_text("upstream: {base_url: 'http://127.0.0.1:9'}\nlisten: {port: 0}\n"
                    f"store: {{path: '{tmp_path / 'state.db'}'}}\n")
    result = run([command, "--config", str(path)], tmp_path, timeout=30,
                 COMPACT_PROXY_ADMIN_TOKEN="x")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [SHORT_TOKEN_LINE]
    assert not (tmp_path / "state.db").exists()
    ok = run(["check-config", "--config", str(path)], tmp_path,
             COMPACT_PROXY_ADMIN_TOKEN="k" * 32)
    assert ok.returncode == 0, ok.stderr


def test_version_prints_the_package_version(tmp_path: Path) -> None:
    """``compact-proxy --version``: the installed package's version, which is pyproject's."""
    import importlib.metadata
    import tomllib

    result = run(["--version"], tmp_path)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    declared = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))[
        "project"]["version"]
    assert declared == importlib.metadata.version("compact-proxy")
    assert result.stdout == f"compact-proxy {declared}\n"


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


# ------------------------------------------------------------------------------ report

OPUS = "claude-opus-4-5-20251101"
OPUS_ENTRY = UsageEntry(
    requests=4, tokens_without_proxy=541_000, tokens_sent=115_000,
    input_tokens=2_000, cache_write_tokens=10_000, cache_read_tokens=100_000,
    output_tokens=3_000, counterfactual_input_tokens=1_000,
    counterfactual_cache_write_tokens=40_000, counterfactual_cache_read_tokens=400_000,
)
SUMMARY_ENTRY = UsageEntry(summary_calls=1, summary_input_tokens=20_000,
                           summary_output_tokens=1_000)
UNPRICED_ENTRY = UsageEntry(requests=1, tokens_without_proxy=10, tokens_sent=10,
                            input_tokens=10, output_tokens=5, counterfactual_input_tokens=10)
# By hand, Opus 4.5 at 5 / 6.25 / 0.50 / 25 USD per million:
#   billed   2000*5 + 10000*6.25 + 100000*0.5 + 3000*25 = 197500  -> 0.1975
#   without  1000*5 + 40000*6.25 + 400000*0.5 + 3000*25 = 530000  -> 0.53
# Haiku 4.5 summaries at 1 / 1.25 / 0.10 / 5: 20000*1 + 1000*5 = 25000 -> 0.025
# Total saving: 0.53 - (0.1975 + 0.025) = 0.3075, 58.02 % of 0.53.


def _add_usage(store: StoreBackend) -> None:
    """Three rows: demo-session's Opus 4.5 requests (added in two parts) and Haiku summaries,
    and a tenant's session on a model without a price."""
    first = UsageEntry(requests=1, input_tokens=2_000, output_tokens=1_000)
    rest = UsageEntry(**{name: getattr(OPUS_ENTRY, name) - getattr(first, name)
                         for name in UsageEntry.field_names()})

    async def go() -> None:
        await store.open()
        try:
            await store.add_usage("demo-session", OPUS, first)
            await store.add_usage("demo-session", OPUS, rest)
            await store.add_usage("demo-session", "claude-haiku-4-5", SUMMARY_ENTRY)
            await store.add_usage(f"{TENANT}/sess-1", "gpt-5", UNPRICED_ENTRY)
        finally:
            await store.close()

    asyncio.run(go())


def test_report_on_an_empty_store_says_so_and_exits_0(tmp_path: Path) -> None:
    """No usage yet: one line, exit 0, and no database file is created by looking."""
    result = run(["report", "--config", str(scoped_config(tmp_path, None))], tmp_path)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == "no usage recorded yet\n"
    assert not (tmp_path / "state").exists()
    _put(tmp_path / "state" / "state.db", "sess-1", "a state but no usage")
    result = run(["report", "--config", str(scoped_config(tmp_path, None))], tmp_path)
    assert (result.returncode, result.stdout) == (0, "no usage recorded yet\n")


def test_report_prints_each_row_then_the_total(tmp_path: Path) -> None:
    """The table: one line per (session, model) with its tokens and costs, then TOTAL;
    a model without a price shows n/a and is named below the table."""
    path = scoped_config(tmp_path, None)
    _add_usage(SQLiteStateStore(tmp_path / "state" / "state.db"))
    result = run(["report", "--config", str(path)], tmp_path)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "SESSION", "MODEL", "REQUESTS", "TOKENS_NO_PROXY", "TOKENS_SENT", "INPUT",
        "CACHE_READ", "CACHE_WRITE", "OUTPUT", "SUMMARIES", "SUMMARY_USD", "BILLED_USD",
        "NO_PROXY_USD", "SAVED_USD", "SAVED_%",
    ]
    rows = {tuple(line.split()[:2]): line.split()[2:] for line in lines[1:4]}
    assert rows[("demo-session", OPUS)] == [
        "4", "541,000", "115,000", "2,000", "100,000", "10,000", "3,000", "0",
        "0.0000", "0.1975", "0.5300", "0.3325", "62.7%",
    ]
    assert rows[("demo-session", "claude-haiku-4-5")] == [
        "0", "0", "0", "0", "0", "0", "0", "1", "0.0250", "0.0000", "0.0000", "-0.0250", "n/a",
    ]
    assert rows[(f"{TENANT}/sess-1", "gpt-5")] == [
        "1", "10", "10", "10", "0", "0", "5", "0", "n/a", "n/a", "n/a", "n/a", "n/a",
    ]
    assert lines[4].split() == [
        "TOTAL", "5", "541,010", "115,010", "2,010", "100,000", "10,000", "3,005", "1",
        "0.0250", "0.1975", "0.5300", "0.3075", "58.0%",
    ]
    assert lines[5].startswith("n/a: no price for gpt-5") and len(lines) == 6


def test_report_json_has_the_same_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--json: one object, every counter of each row, costs rounded to 6 decimals, null
    where the model has no price; a prices: entry in the config prices it."""
    path = scoped_config(tmp_path, None)
    _add_usage(SQLiteStateStore(tmp_path / "state" / "state.db"))
    assert main(["report", "--config", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(row["session"], row["model"]) for row in data["sessions"]] == [
        ("demo-session", "claude-haiku-4-5"), ("demo-session", OPUS), (f"{TENANT}/sess-1", "gpt-5"),
    ]
    opus = data["sessions"][1]
    assert {name: opus[name] for name in UsageEntry.field_names()} == msgspec.structs.asdict(
        OPUS_ENTRY)
    assert (opus["cost_billed"], opus["cost_summary"], opus["cost_without_proxy"],
            opus["net_saving"], opus["saving_percent"]) == (0.1975, 0.0, 0.53, 0.3325, 62.74)
    assert opus["last_seen"].endswith("+00:00")
    gpt = data["sessions"][2]
    assert [gpt[key] for key in ("cost_billed", "cost_summary", "cost_without_proxy",
                                 "net_saving", "saving_percent")] == [None] * 5
    total = data["total"]
    assert (total["requests"], total["summary_calls"], total["output_tokens"]) == (5, 1, 3_005)
    assert (total["cost_billed"], total["cost_summary"], total["cost_without_proxy"],
            total["net_saving"], total["saving_percent"]) == (0.1975, 0.025, 0.53, 0.3075, 58.02)
    assert total["unpriced_models"] == ["gpt-5"]

    priced = tmp_path / "priced.yaml"
    priced.write_text(path.read_text(encoding="utf-8") + (
        "prices: {gpt-5: {input: 1000, cache_write: 0, cache_read: 0, output: 2000}}\n"),
        encoding="utf-8")
    assert main(["report", "--config", str(priced), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    # 10*1000 + 5*2000 = 20000 -> 0.02 billed; 10*1000 + 5*2000 -> 0.02 without the proxy.
    assert (data["sessions"][2]["cost_billed"], data["sessions"][2]["net_saving"]) == (0.02, 0.0)
    assert data["total"]["unpriced_models"] == []
    assert data["total"]["cost_billed"] == 0.2175


def test_report_session_filter_matches_the_id_under_any_tenant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--session SID keeps the rows of that session id (any tenant) or store key."""
    path = scoped_config(tmp_path, None)
    _add_usage(SQLiteStateStore(tmp_path / "state" / "state.db"))
    for sid, expected in (("sess-1", [f"{TENANT}/sess-1"]), (f"{TENANT}/sess-1",
                                                              [f"{TENANT}/sess-1"]),
                          ("demo-session", ["demo-session", "demo-session"])):
        assert main(["report", "--config", str(path), "--json", "--session", sid]) == 0
        data = json.loads(capsys.readouterr().out)
        assert [row["session"] for row in data["sessions"]] == expected
    assert main(["report", "--config", str(path), "--session", "other"]) == 0
    assert capsys.readouterr().out == "no usage recorded for session other\n"
    # --tenant addresses one tenant's session, as `session SID --tenant T` does.
    for tenant, expected in ((TENANT, [f"{TENANT}/sess-1"]), ("none", [])):
        assert main(["report", "--config", str(path), "--json", "--session", "sess-1",
                     "--tenant", tenant]) == 0
        data = json.loads(capsys.readouterr().out)
        assert [row["session"] for row in data["sessions"]] == expected


def test_report_with_a_bad_config_exits_2(tmp_path: Path) -> None:
    result = run(["report", "--config", str(bad_config(tmp_path))], tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines() == [BAD_KEY_LINE]


def test_report_reads_a_redis_store(
    tmp_path: Path, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """store.backend redis: the same figures, read from the server the config names."""
    url = redis_url.rsplit("/", 1)[0] + "/9"  # a database of its own, under the default prefix
    asyncio.run(_flush(url))
    path = tmp_path / "redis.yaml"
    path.write_text("upstream: {base_url: 'https://api.anthropic.com'}\n"
                    f"store: {{backend: redis, url: '{url}'}}\n", encoding="utf-8")
    _add_usage(RedisStateStore(url))
    assert main(["report", "--config", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["sessions"]) == 3
    assert (data["total"]["net_saving"], data["total"]["saving_percent"]) == (0.3075, 58.02)


async def _flush(url: str) -> None:
    client = aioredis.Redis.from_url(url)
    try:
        await client.flushdb()
    finally:
        await client.aclose()


# ------------------------------------------------------------------------------ the audit log

AUDIT_NOW = datetime.now(UTC).replace(microsecond=0)


def _entry(session: str, minutes_ago: int, *, blocked: bool = False,
           tenant: str = "none") -> RequestEntry:
    return RequestEntry(
        at=AUDIT_NOW - timedelta(minutes=minutes_ago), request_id=f"req-{session}-{minutes_ago}",
        session_id=session, tenant=tenant, route="messages", role="main",
        model="claude-sonnet-4-5", tokens_before=100_000 if blocked else 40_000,
        tokens_after=90_000 if blocked else 10_000,
        layers=(LayerSaving("L1", 6_000), LayerSaving("L3", 4_000)) if blocked
        else (LayerSaving("L1", 30_000),),
        outcome="blocked" if blocked else "forwarded",
        reason="MessageViewLimitExceeded" if blocked else None,
        hard_limit=80_000 if blocked else None, status=400 if blocked else 200,
        upstream_status=None if blocked else 200, usage_input=None if blocked else 9_500,
        usage_output=None if blocked else 120, duration_ms=42.0)


def _audit_config(tmp_path: Path) -> Path:
    """A config whose store and source roots are under tmp_path."""
    path = tmp_path / "audit.yaml"
    path.write_text(
        "upstream: {base_url: 'https://api.anthropic.com'}\n"
        f"store: {{path: '{tmp_path / 'state' / 'state.db'}'}}\n"
        f"sources: {{transcript_root: '{tmp_path / 'transcripts'}', "
        f"artifact_root: '{tmp_path / 'artifacts'}'}}\n", encoding="utf-8")
    return path


def _fill_audit(store: StoreBackend) -> None:
    """sess-a: two forwarded requests and one refused 3 h ago; sess-b: one refused 20 min ago
    and one forwarded; a tenant's sess-c; sess-a's durable state and one change."""
    async def go() -> None:
        await store.open()
        try:
            for entry in (_entry("sess-a", 300), _entry("sess-a", 200, blocked=True),
                          _entry("sess-a", 100), _entry("sess-b", 20, blocked=True),
                          _entry("sess-b", 10), _entry("sess-c", 5, tenant=TENANT)):
                await store.add_request(entry)
            await store.put_state("sess-a", DurableContextState.from_dict({
                "facts": [{"fact_id": "keep-api", "content": "never shown by the CLI",
                           "source_pointer": "transcript:sess-a:1",
                           "last_confirmed_at": "2026-12-01T09:00:00Z"}],
                "pending_items": [{"item_id": "changelog", "description": "add an entry",
                                   "source_pointer": "transcript:sess-a:2",
                                   "last_confirmed_at": "2026-12-01T09:00:00Z",
                                   "status": "blocked"}]}), None)
            await store.add_state_change(StateChange(
                at=AUDIT_NOW - timedelta(minutes=1), session_id="sess-a", tenant="none",
                actor="admin-api:alice", action="put", version=1,
                detail=("fact keep-api added", "pending changelog added (blocked)")))
        finally:
            await store.close()

    asyncio.run(go())


def test_audit_commands_on_an_empty_store_say_so_without_creating_it(tmp_path: Path) -> None:
    """No store file yet: each command prints one line, exits 0 and creates nothing (a session
    it cannot know of is exit 1, below)."""
    path = _audit_config(tmp_path)
    for args, line in ((["sessions"], "no sessions in the audit log"),
                       (["blocked", "--since", "2d"], "no blocked requests since ")):
        result = run([*args, "--config", str(path)], tmp_path)
        assert (result.returncode, result.stderr) == (0, ""), result.stderr
        assert result.stdout.startswith(line)
    assert not (tmp_path / "state").exists()


UNKNOWN_SESSION_LINE = (
    "session: no session nosuch under tenant none: no request, durable state or change "
    "(`compact-proxy sessions` lists the sessions and their tenants)")


def test_session_unknown_exits_1_with_one_line(tmp_path: Path) -> None:
    """``session nosuch``: one line saying no such session, exit 1, on an empty store (not
    created) and on a store with other sessions, as for a session of another tenant, which
    its ``--tenant`` shows."""
    path = _audit_config(tmp_path)
    result = run(["session", "nosuch", "--config", str(path)], tmp_path)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.splitlines() == [UNKNOWN_SESSION_LINE]
    assert not (tmp_path / "state").exists()
    _fill_audit(SQLiteStateStore(tmp_path / "state" / "state.db", audit_linger_s=0.01))
    result = run(["session", "nosuch", "--config", str(path)], tmp_path)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.splitlines() == [UNKNOWN_SESSION_LINE]
    result = run(["session", "sess-c", "--config", str(path)], tmp_path)
    assert result.returncode == 1 and "under tenant none" in result.stderr
    assert run(["session", "sess-c", "--tenant", TENANT, "--config", str(path)],
               tmp_path).returncode == 0


def test_sessions_prints_a_table_newest_first(tmp_path: Path) -> None:
    """One line per session: id, tenant, last seen, requests, tokens before and after, % saved,
    blocked; --order blocked and --contains change which and in what order."""
    path = _audit_config(tmp_path)
    _fill_audit(SQLiteStateStore(tmp_path / "state" / "state.db", audit_linger_s=0.01))
    result = run(["sessions", "--config", str(path)], tmp_path)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["SESSION", "TENANT", "LAST_SEEN", "REQUESTS", "TOKENS_BEFORE",
                                "TOKENS_AFTER", "SAVED_%", "BLOCKED"]
    rows = [line.split() for line in lines[1:]]
    assert [row[:2] for row in rows] == [["sess-c", TENANT], ["sess-b", "none"],
                                         ["sess-a", "none"]]
    seen = (AUDIT_NOW - timedelta(minutes=100)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert rows[2][2:] == [seen, "3", "180,000", "110,000", "38.9%", "1"]
    assert len(lines) == 4
    result = run(["sessions", "--config", str(path), "--order", "blocked", "--contains", "SESS-",
                  "--limit", "2"], tmp_path)
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines[1:3]] == ["sess-b", "sess-a"]
    assert lines[3] == "(2 of 3 sessions; --offset and --limit page through)"


def test_sessions_json_is_the_admin_apis_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--json: the sessions as SessionSummary.as_json(), the total and the page."""
    path = _audit_config(tmp_path)
    _fill_audit(SQLiteStateStore(tmp_path / "state" / "state.db", audit_linger_s=0.01))
    assert main(["sessions", "--config", str(path), "--json", "--offset", "1"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["total"], data["offset"], data["limit"]) == (3, 1, 50)
    assert [s["session_id"] for s in data["sessions"]] == ["sess-b", "sess-a"]
    assert data["sessions"][1] == {
        "session_id": "sess-a", "tenant": "none",
        "last_seen": (AUDIT_NOW - timedelta(minutes=100)).isoformat(timespec="microseconds"),
        "requests": 3, "tokens_before": 180_000, "tokens_after": 110_000,
        "saved_ratio": 0.3889, "blocked": 1}


def test_session_shows_requests_state_with_source_statuses_and_changes(tmp_path: Path) -> None:
    """session SID: its requests newest first (layers with what each saved), its durable state
    with each pointer's status through the resolver (no content), and its changes."""
    path = _audit_config(tmp_path)
    _fill_audit(SQLiteStateStore(tmp_path / "state" / "state.db", audit_linger_s=0.01))
    (tmp_path / "transcripts").mkdir()
    (tmp_path / "transcripts" / "sess-a.jsonl").write_text(json.dumps(
        {"sequence": 1, "session_id": "sess-a", "event_id": "e1", "text": "keep it"}) + "\n",
        encoding="utf-8")
    result = run(["session", "sess-a", "--config", str(path)], tmp_path)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "session sess-a (tenant none): 3 requests in the audit log"
    assert lines[1].split() == ["AT", "ROUTE", "ROLE", "MODEL", "OUTCOME", "REASON", "LAYERS",
                                "STATUS", "TOKENS_BEFORE", "TOKENS_AFTER", "USAGE_IN",
                                "USAGE_OUT", "MS"]
    assert lines[2].split()[1:] == ["messages", "main", "claude-sonnet-4-5", "forwarded", "-",
                                    "L1:30000", "200", "40,000", "10,000", "9,500", "120", "42"]
    assert lines[3].split()[4:10] == ["blocked", "MessageViewLimitExceeded", "L1:6000,L3:4000",
                                      "400", "100,000", "90,000"]
    assert lines[5].startswith("durable state: version 1, updated ")
    assert lines[6].split() == ["fact", "keep-api", "transcript:sess-a:1", "(available)"]
    assert lines[7].split() == ["pending", "changelog", "status=blocked", "transcript:sess-a:2",
                                "(missing)"]
    assert lines[8] == "state changes (newest first):"
    assert lines[9].split()[1:] == ["admin-api:alice", "put", "v1", "fact", "keep-api", "added;",
                                    "pending", "changelog", "added", "(blocked)"]
    assert "never shown" not in result.stdout and "keep it" not in result.stdout


def test_session_json_and_tenant(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--json carries the entries, the state with each source's status, and the changes;
    --tenant reads that tenant's session."""
    path = _audit_config(tmp_path)
    _fill_audit(SQLiteStateStore(tmp_path / "state" / "state.db", audit_linger_s=0.01))
    assert main(["session", "sess-a", "--config", str(path), "--json", "--limit", "1"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["total"] == 3 and len(data["requests"]) == 1
    assert data["requests"][0] == _entry("sess-a", 100).as_json()
    assert data["state"]["version"] == 1
    assert [(s["pointer"], s["status"]) for s in data["state"]["sources"]] == [
        ("transcript:sess-a:1", "missing"), ("transcript:sess-a:2", "missing")]
    assert data["changes"][0]["actor"] == "admin-api:alice"
    assert main(["session", "sess-c", "--tenant", TENANT, "--config", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["tenant"], data["total"], data["state"]) == (TENANT, 1, None)


@pytest.mark.parametrize(("args", "message"), [
    (["session", "a..b"], "session: session id: "),
    (["session", "sess-a", "--tenant", "sk-ant-pasted"], "session: --tenant: not a tenant"),
    (["blocked", "--since", "yesterday"], "blocked: --since: 'yesterday' is neither"),
])
def test_audit_command_refusals_exit_2_with_one_line(tmp_path: Path, args: list[str],
                                                     message: str) -> None:
    """A bad session id, tenant or --since: one line on stderr, exit 2."""
    result = run([*args, "--config", str(_audit_config(tmp_path))], tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith(message) and len(result.stderr.splitlines()) == 1
    assert "sk-ant-pasted" not in result.stderr


def test_blocked_lists_refusals_since_a_time_oldest_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--since 1h: the refusals of the last hour; 4h (or an ISO time) reaches further; one line
    each: time, session, tenant, reason, tokens before and after, hard limit."""
    path = _audit_config(tmp_path)
    _fill_audit(SQLiteStateStore(tmp_path / "state" / "state.db", audit_linger_s=0.01))
    result = run(["blocked", "--since", "1h", "--config", str(path)], tmp_path)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["AT", "SESSION", "TENANT", "REASON", "TOKENS_BEFORE",
                                "TOKENS_AFTER", "HARD_LIMIT"]
    at = (AUDIT_NOW - timedelta(minutes=20)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert [line.split() for line in lines[1:]] == [
        [at, "sess-b", "none", "MessageViewLimitExceeded", "100,000", "90,000", "80,000"]]
    since = (AUDIT_NOW - timedelta(hours=4)).isoformat()
    for when in ("4h", "240m", since, since.replace("+00:00", "")):
        assert main(["blocked", "--since", when, "--config", str(path), "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert [e["session_id"] for e in data["blocked"]] == ["sess-a", "sess-b"], when
        assert data["blocked"][0] == _entry("sess-a", 200, blocked=True).as_json()


def test_audit_commands_read_a_redis_store(
    tmp_path: Path, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """store.backend redis: the same sessions and refusals, read from the server."""
    url = redis_url.rsplit("/", 1)[0] + "/8"  # a database of its own, under the default prefix
    asyncio.run(_flush(url))
    path = tmp_path / "redis.yaml"
    path.write_text("upstream: {base_url: 'https://api.anthropic.com'}\n"
                    f"store: {{backend: redis, url: '{url}'}}\n", encoding="utf-8")
    _fill_audit(RedisStateStore(url, audit_linger_s=0.01))
    assert main(["sessions", "--config", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["session_id"] for s in data["sessions"]] == ["sess-c", "sess-b", "sess-a"]
    assert main(["blocked", "--since", "1d", "--config", str(path), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["blocked"]) == 2


def test_move_session_moves_its_source_files_into_the_tenants_directory(tmp_path: Path) -> None:
    """The transcript and the artifact folder go to ``<root>/<tenant>/`` with the state; a
    second move onto files that exist is refused (exit 2, one line) and nothing moves."""
    path = scoped_config(tmp_path, None)
    db = tmp_path / "state" / "state.db"
    transcripts = tmp_path / "compact-proxy-state" / "transcripts"
    artifacts = tmp_path / "compact-proxy-state" / "artifacts"
    (artifacts / "sess-1").mkdir(parents=True)
    transcripts.mkdir(parents=True)
    (transcripts / "sess-1.jsonl").write_text("{}\n", encoding="utf-8")
    (artifacts / "sess-1" / "notes.md").write_text("notes", encoding="utf-8")
    _put(db, "sess-1", "kept fact")
    result = run(["move-session", "--config", str(path), "--session", "sess-1",
                  "--to-tenant", TENANT], tmp_path)
    assert result.returncode == 0, result.stderr
    assert (transcripts / TENANT / "sess-1.jsonl").read_text(encoding="utf-8") == "{}\n"
    assert (artifacts / TENANT / "sess-1" / "notes.md").read_text(encoding="utf-8") == "notes"
    assert not (transcripts / "sess-1.jsonl").exists() and not (artifacts / "sess-1").exists()
    assert _read(db, f"{TENANT}/sess-1")[0] == "kept fact"

    (transcripts / "sess-1.jsonl").write_text("new\n", encoding="utf-8")  # files only, again
    _put(db, "sess-1", "second")
    result = run(["move-session", "--config", str(path), "--session", "sess-1",
                  "--to-tenant", TENANT], tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and "already has sources" in result.stderr
    assert (transcripts / "sess-1.jsonl").read_text(encoding="utf-8") == "new\n"
    assert _read(db, "sess-1")[0] == "second"
    assert _read(db, f"{TENANT}/sess-1")[0] == "kept fact"
