"""``move-session`` with an ``s3://`` root: a session's objects move to its tenant's prefix.

Against a real S3-compatible server (moto, on loopback), with mixed roots (local transcripts,
artifacts in a bucket): the state, the transcript file and the artifact objects all move, and
the pool then resolves them for the tenant; a target prefix that holds objects already is
refused before anything moves.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from compactor import DurableContextState, DurableFact
from policies import SourceAccessPolicy
from proxy.http.tenants import scoped_key
from proxy.sources.migrate import MoveRefused, move_session_and_sources
from proxy.sources.resolvers import ResolverPool
from proxy.sources.s3_roots import S3Settings
from proxy.store.sqlite import SQLiteStateStore
from tests.proxy.sources.s3_helpers import (
    REPORT,
    REPORT_SHA,
    SID,
    event,
    new_store,
    put_artifact,
    sha,
)
from tests.s3_server import MotoServer

if TYPE_CHECKING:
    from types_aiobotocore_s3.client import S3Client

TENANT = "t0123456789abcdef"


def state() -> DurableContextState:
    return DurableContextState(facts=(
        DurableFact("f1", "deploys", f"transcript:{SID}:1", "2025-03-01T12:30:00Z"),
        DurableFact("f2", "report", f"artifact:{SID}:report.txt:{REPORT_SHA}",
                    "2025-03-01T12:30:00Z")))


async def keys(client: S3Client, name: str) -> list[str]:
    listed = await client.list_objects_v2(Bucket=name)
    return sorted(item["Key"] for item in listed.get("Contents", ()))


async def test_a_sessions_local_file_and_objects_move_to_its_tenant(
        s3: S3Client, bucket: str, moto: MotoServer,  # noqa: F811  (the fixtures)
        tmp_path: Path) -> None:
    line = event(1, text="deploy on fridays")
    transcripts = tmp_path / "transcripts"
    transcripts.mkdir()
    (transcripts / f"{SID}.jsonl").write_text(line + "\n", encoding="utf-8")
    await put_artifact(s3, bucket, "report.txt", REPORT)
    await put_artifact(s3, bucket, "extra.txt", b"x")
    roots = (str(transcripts), f"s3://{bucket}/team/artifacts")
    store = await SQLiteStateStore(tmp_path / "state.db").open()
    objects = new_store(moto.url)
    pool = ResolverPool(*roots, SourceAccessPolicy(), s3=S3Settings(endpoint_url=moto.url))
    try:
        await store.put_state(SID, state(), None)
        moved = await move_session_and_sources(store, roots, SID, "none", TENANT,
                                               objects=objects)
        assert moved.state is not None
        assert await store.get_state(SID) is None
        assert await store.get_state(scoped_key(TENANT, SID)) is not None
        assert len(moved.sources) == 3
        assert await keys(s3, bucket) == [f"team/artifacts/{TENANT}/{SID}/extra.txt",
                                          f"team/artifacts/{TENANT}/{SID}/report.txt"]
        assert (transcripts / TENANT / f"{SID}.jsonl").exists()
        statuses = await pool.resolve(SID, state(), tenant=TENANT)
        assert [(r.status, r.evidence_sha256) for r in statuses] == [
            ("available", sha(line)), ("available", REPORT_SHA)]

        # Back under tenant none, where an object of the session exists again: refused,
        # nothing moved.
        await put_artifact(s3, bucket, "report.txt", REPORT)
        with pytest.raises(MoveRefused, match="holds objects already"):
            await move_session_and_sources(store, roots, SID, TENANT, "none",
                                           objects=objects)
        assert await store.get_state(scoped_key(TENANT, SID)) is not None
        assert (transcripts / TENANT / f"{SID}.jsonl").exists()
        assert len(await keys(s3, bucket)) == 3
    finally:
        await pool.close()
        await objects.close()
        await store.close()


def test_an_s3_root_without_an_object_store_is_refused(tmp_path: Path) -> None:
    async def go() -> None:
        store = await SQLiteStateStore(tmp_path / "state.db").open()
        try:
            with pytest.raises(MoveRefused, match="no object store"):
                await move_session_and_sources(store, ("./t", "s3://team-sources/a"), SID,
                                               "none", TENANT)
        finally:
            await store.close()

    asyncio.run(go())
