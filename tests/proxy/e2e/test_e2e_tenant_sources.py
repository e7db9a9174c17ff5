"""End to end: source pointers resolve in the requesting tenant's own directory.

With ``session.scope: credential`` the source roots hold one directory per tenant
(``<root>/<tenant>/<session>.jsonl``, ``<root>/<tenant>/<session>/<file>``): tenant B naming
A's session id resolves nothing of A's (no digest of A's in ``system``, no excerpt of A's for
the operator), and ``move-session`` moves a session's files into its tenant's directory along
with its durable state. Through the real proxy, the real SDK, the CLI and the strict fake.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from compactor import DurableContextState
from proxy.http.tenants import NO_TENANT, scoped_key
from tests.conftest import ProxyFactory, RunningProxy, UpstreamServer, user_text
from tests.proxy.e2e.helpers import (
    KEY_A,
    KEY_B,
    SECRET_ENV,
    TENANT_SECRET,
    forwarded,
    sdk_tenant,
    send,
    tenants,
    write_state,
)

SCOPE = {"session": {"scope": "credential", "secret_env": SECRET_ENV}}

SESSION = "shared-session-7"
A_TEXT = "TENANT-A-TRANSCRIPT-LINE: the prod database password rotates on mondays"
ADMIN_TOKEN = "admin-token-for-the-isolation-tests-5b7c0e2f9a41"


def transcript_state(session_id: str, digest: str) -> DurableContextState:
    """One fact on event 1 of ``session_id``'s transcript, one artifact pointer."""
    return DurableContextState.from_dict({
        "facts": [{"fact_id": "f1", "content": "the deploy window",
                   "source_pointer": f"transcript:{session_id}:1",
                   "last_confirmed_at": "2026-01-01T00:00:00Z"},
                  {"fact_id": "f2", "content": "the notes",
                   "source_pointer": f"artifact:{session_id}:notes.md:{digest}",
                   "last_confirmed_at": "2026-01-01T00:00:00Z"}],
        "pending_items": [], "retrieval_evidence": []})


def admin_sources(proxy: RunningProxy, tenant: str, session_id: str) -> dict[str, Any]:
    """The operator's view of a session's pointers (``?resolve=true``), by pointer."""
    url = (f"{proxy.base_url}/admin/tenants/{tenant}/sessions/{session_id}/state"
           "?resolve=true")
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        body = json.loads(resp.read())
    return {source["pointer"]: source for source in body["sources"]}


def cli_config(proxy: RunningProxy, tmp_path: Path) -> Path:
    """A config file naming the proxy's store and source roots (for the CLI)."""
    path = tmp_path / "cli.yaml"
    path.write_text(yaml.safe_dump({
        "upstream": {"base_url": str(proxy.config.upstream.base_url)},
        "store": {"path": str(proxy.config.store.path)},
        "sources": {"transcript_root": str(proxy.transcript_root),
                    "artifact_root": str(proxy.artifact_root)},
        "session": {"scope": "credential", "secret_env": SECRET_ENV}}), encoding="utf-8")
    return path


def test_another_tenant_naming_a_session_id_resolves_none_of_its_sources(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer,
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A's transcript and artifact sit in the roots as before the scope was on; A's state is
    moved to A's tenant with ``move-session``, which moves the files into A's directory. B,
    whose own state names A's session id and A's pointers, gets no digest of A's in
    ``system`` and the operator sees no excerpt of A's under B; A's own pointers resolve."""
    monkeypatch.setenv(SECRET_ENV, TENANT_SECRET)
    proxy = proxy_factory({**SCOPE, "summary": {"enabled": False}}, admin_token=ADMIN_TOKEN)
    scope = tenants(proxy)
    tenant_a, tenant_b = sdk_tenant(scope, KEY_A), sdk_tenant(scope, KEY_B)
    line = json.dumps({"sequence": 1, "session_id": SESSION, "event_id": "e1",
                       "text": A_TEXT})
    (proxy.transcript_root / f"{SESSION}.jsonl").write_text(line + "\n", encoding="utf-8")
    notes = b"TENANT-A-NOTES: the incident report"
    (proxy.artifact_root / SESSION).mkdir()
    (proxy.artifact_root / SESSION / "notes.md").write_bytes(notes)
    line_digest = hashlib.sha256(line.encode()).hexdigest()
    notes_digest = hashlib.sha256(notes).hexdigest()
    state = transcript_state(SESSION, notes_digest)
    write_state(proxy, scoped_key(NO_TENANT, SESSION), state)  # A's, from before the scope
    write_state(proxy, scoped_key(tenant_b, SESSION), state)   # B names A's session id

    moved = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "move-session", "--config",
         str(cli_config(proxy, tmp_path)), "--session", SESSION, "--to-tenant", tenant_a],
        capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert moved.returncode == 0, moved.stderr

    messages = [{"role": "user", "content": user_text("what is the deploy window?")}]
    send(proxy, messages, api_key=KEY_B, headers={"x-compact-session-id": SESSION})
    system_b = json.dumps(forwarded(upstream_server)[-1].get("system"))
    assert line_digest not in system_b and notes_digest not in system_b.replace(
        f"notes.md:{notes_digest}", "")
    assert "source_status=available" not in system_b
    for pointer, source in admin_sources(proxy, tenant_b, SESSION).items():
        assert source["status"] != "available", pointer
        assert source["excerpt"] is None and source["evidence_sha256"] is None

    send(proxy, messages, api_key=KEY_A, headers={"x-compact-session-id": SESSION})
    system_a = json.dumps(forwarded(upstream_server)[-1].get("system"))
    assert f"evidence_sha256={line_digest}" in system_a
    assert f"evidence_sha256={notes_digest}" in system_a
    sources_a = admin_sources(proxy, tenant_a, SESSION)
    assert sources_a[f"transcript:{SESSION}:1"]["excerpt"] == A_TEXT
    assert (proxy.transcript_root / tenant_a / f"{SESSION}.jsonl").exists()
    assert (proxy.artifact_root / tenant_a / SESSION / "notes.md").exists()
    assert not (proxy.transcript_root / f"{SESSION}.jsonl").exists()
