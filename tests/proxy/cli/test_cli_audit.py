"""Tests for compact-proxy sessions, session and blocked: the audit log read from the store."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from compactor import DurableContextState
from proxy.audit.log import LayerSaving, RequestEntry, StateChange
from proxy.cli.commands import main
from proxy.store import RedisStateStore, SQLiteStateStore, StoreBackend
from tests.proxy.cli.helpers import TENANT, _flush, run

pytestmark = pytest.mark.slow


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
