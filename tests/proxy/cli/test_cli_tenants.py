"""Tests for compact-proxy tenant-id and move-session (state and source files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.config import load_config
from proxy.http.tenants import TenantScope
from tests.proxy.cli.helpers import (
    BAD_KEY_LINE,
    CREDENTIAL,
    SECRET,
    TENANT,
    _put,
    _read,
    bad_config,
    run,
    scoped_config,
)

pytestmark = pytest.mark.slow


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
