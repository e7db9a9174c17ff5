"""The resolver pool's roots per tenant: a tenant's pointers resolve in its own directory of
each root, tenant ``none`` in the roots themselves, a shared session's in the roots for every
tenant. Real files in ``tmp_path``."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from compactor import DurableContextState, DurableFact
from policies import SourceAccessPolicy
from proxy.sources.resolvers import ResolverPool, tenant_root

TENANT_A = "t0123456789abcdef"
TENANT_B = "tfedcba9876543210"


def write_transcript(root: Path, session: str, text: str) -> str:
    """Event 1 of ``session``'s transcript under ``root``; its digest."""
    line = json.dumps({"sequence": 1, "session_id": session, "event_id": "e1", "text": text})
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{session}.jsonl").write_text(line + "\n", encoding="utf-8")
    return hashlib.sha256(line.encode()).hexdigest()


def facts(*sessions: str) -> DurableContextState:
    return DurableContextState(facts=tuple(
        DurableFact(f"f{n}", "x", f"transcript:{sid}:1", "2025-03-01T12:30:00Z")
        for n, sid in enumerate(sessions)))


async def test_each_tenant_reads_its_own_directory_and_shared_sessions_the_roots(
        tmp_path: Path) -> None:
    transcripts = tmp_path / "t"
    own = write_transcript(transcripts / TENANT_A, "s1", "A's own")
    shared = write_transcript(transcripts, "kb", "for everyone")
    legacy = write_transcript(transcripts, "s1", "tenant none's")
    pool = ResolverPool(str(transcripts), str(tmp_path / "a"),
                        SourceAccessPolicy(shared_sessions=["kb"]))
    state = facts("s1", "kb")
    found_a = await pool.resolve("s1", state, tenant=TENANT_A)
    assert [(r.status, r.evidence_sha256) for r in found_a] == [
        ("available", own), ("available", shared)]
    found_b = await pool.resolve("s1", state, tenant=TENANT_B)
    assert [r.status for r in found_b] == ["missing", "available"]
    found_none = await pool.resolve("s1", state, tenant="none")
    assert [r.evidence_sha256 for r in found_none] == [legacy, shared]
    excerpts = await pool.excerpts("s1", state, tenant=TENANT_A)
    assert [e.text for e in excerpts] == ["A's own", "for everyone"]


@pytest.mark.parametrize("tenant", ["..", ".", "a/b", "", "t01/../.."])
def test_a_tenant_that_cannot_name_a_directory_is_refused(tenant: str) -> None:
    with pytest.raises(ValueError, match="not a tenant"):
        tenant_root("/srv/transcripts", tenant)


def test_tenant_roots_of_paths_and_urls() -> None:
    assert tenant_root("/srv/t", "none") == "/srv/t"
    assert tenant_root("/srv/t", TENANT_A) == f"/srv/t/{TENANT_A}"
    assert tenant_root("s3://b/team/t/", TENANT_A) == f"s3://b/team/t/{TENANT_A}/"
    assert tenant_root("s3://b", TENANT_A) == f"s3://b/{TENANT_A}/"
