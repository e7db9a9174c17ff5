"""s3:// roots in the config, the session command, and the real proxy end to end."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import anthropic
import pytest

from compactor import DurableContextState, DurableFact
from policies import SourceAccessPolicy
from proxy.cli.commands import main as cli_main
from proxy.config import Config, ConfigError
from proxy.fake_upstream import is_summarizer_request
from proxy.http.tenants import scoped_key
from proxy.sources.resolvers import ResolverPool
from proxy.sources.s3_roots import S3Root, S3Settings, parse_s3_root
from proxy.store.sqlite import SQLiteStateStore
from tests.conftest import TEST_API_KEY, ProxyFactory, UpstreamServer, user_text
from tests.proxy.sources.s3_helpers import (
    REPORT,
    REPORT_SHA,
    SID,
    event,
    put_artifact,
    put_transcript,
    setup_client,
    sha,
)
from tests.s3_server import MotoServer

if TYPE_CHECKING:
    from types_aiobotocore_s3.client import S3Client

# --- configuration --------------------------------------------------------------------------


def test_config_accepts_s3_roots_and_settings() -> None:
    config = Config.from_mapping({"upstream": {"base_url": "https://api.anthropic.com"},
                                  "sources": {
        "transcript_root": "s3://team-sources/transcripts",
        "artifact_root": "s3://team-sources/a/b/",
        "s3": {"endpoint_url": "http://127.0.0.1:9000", "region": "eu-west-1"}}})
    assert config.sources.s3_settings() == S3Settings("http://127.0.0.1:9000", "eu-west-1")
    assert parse_s3_root(config.sources.artifact_root) == S3Root("team-sources", "a/b/")
    assert Config().sources.s3_settings() == S3Settings(None, None)


@pytest.mark.parametrize("sources, key, words", [
    ({"transcript_root": "s3://Team_Sources/t", "artifact_root": "s3://team-sources/a"},
     "sources.transcript_root", "not a bucket name"),
    ({"transcript_root": "s3://team-sources/t/../u", "artifact_root": "s3://team-sources/a"},
     "sources.transcript_root", "prefix segment '..'"),
    ({"transcript_root": "s3://team-sources/t", "artifact_root": "s3://team-sources//a"},
     "sources.artifact_root", "prefix segment ''"),
    ({"transcript_root": "s3://team-sources/t?x=1", "artifact_root": "s3://team-sources/a"},
     "sources.transcript_root", "not allowed"),
    ({"s3": {"endpoint_url": "ftp://store"}}, "sources.s3.endpoint_url", "http:// or https://"),
    ({"s3": {"bucket": "x"}}, "sources.s3.bucket", "unknown key"),
])
def test_config_refuses_bad_s3_roots(sources: dict[str, Any], key: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        Config.from_mapping({"upstream": {"base_url": "https://api.anthropic.com"},
                             "sources": sources})
    assert info.value.key == key, str(info.value)
    assert words in info.value.problem, str(info.value)


def test_config_accepts_roots_of_two_kinds() -> None:
    config = Config.from_mapping({"upstream": {"base_url": "https://api.anthropic.com"},
                                  "sources": {"transcript_root": "./transcripts",
                                              "artifact_root": "s3://team-sources/a"}})
    assert config.sources.artifact_root == "s3://team-sources/a"


async def test_local_transcripts_and_artifacts_in_a_bucket_per_tenant(
        s3: S3Client, bucket: str, moto: MotoServer, tmp_path: Path) -> None:
    """Mixed roots: each pointer resolves on its kind's root, in the pointers' order, and in
    the tenant's own directory (prefix) of each; excerpts likewise."""
    tenant = "t0123456789abcdef"
    lines = [event(1, text="deploy on fridays")]
    (tmp_path / tenant).mkdir()
    (tmp_path / tenant / f"{SID}.jsonl").write_text(lines[0] + "\n", encoding="utf-8")
    await put_artifact(s3, bucket, "report.txt", REPORT, session=f"{tenant}/{SID}")
    state = DurableContextState(
        facts=(DurableFact("f1", "report", f"artifact:{SID}:report.txt:{REPORT_SHA}",
                           "2025-03-01T12:30:00Z"),
               DurableFact("f2", "deploys", f"transcript:{SID}:1", "2025-03-01T12:30:00Z"),
               DurableFact("f3", "gone", f"artifact:{SID}:gone.txt:{REPORT_SHA}",
                           "2025-03-01T12:30:00Z")))
    pool = ResolverPool(str(tmp_path), f"s3://{bucket}/team/artifacts", SourceAccessPolicy(),
                        s3=S3Settings(endpoint_url=moto.url))
    try:
        statuses = await pool.resolve(SID, state, tenant=tenant)
        assert [(r.pointer, r.status, r.evidence_sha256) for r in statuses] == [
            (f"artifact:{SID}:report.txt:{REPORT_SHA}", "available", REPORT_SHA),
            (f"transcript:{SID}:1", "available", sha(lines[0])),
            (f"artifact:{SID}:gone.txt:{REPORT_SHA}", "missing", None)]
        excerpts = await pool.excerpts(SID, state, tenant=tenant, max_chars=10)
        assert [e.text for e in excerpts] == ["all tests ", "deploy on ", None]
        # Tenant none reads the roots themselves, where neither source is.
        assert [r.status for r in await pool.resolve(SID, state, tenant="none")] == [
            "missing", "missing", "missing"]
    finally:
        await pool.close()


def test_session_command_resolves_against_the_object_store(
        moto: MotoServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``compact-proxy session`` shows each pointer's status from the s3:// roots."""
    bucket = f"cli-{uuid.uuid4().hex[:12]}"
    line = event(1)

    async def seed() -> None:
        async with setup_client(moto.url) as client:
            await client.create_bucket(Bucket=bucket)
            await put_transcript(client, bucket, [line])
        store = await SQLiteStateStore(tmp_path / "state.db").open()
        try:
            await store.put_state(scoped_key("none", SID), DurableContextState(facts=(
                DurableFact("f1", "a fact", "transcript:sess-s3:1", "2025-03-01T12:30:00Z"),
                DurableFact("f2", "gone", "transcript:sess-s3:2", "2025-03-01T12:30:00Z"),
                DurableFact("f3", "not ours", "transcript:sess-other:1",
                            "2025-03-01T12:30:00Z"))), None)
        finally:
            await store.close()

    asyncio.run(seed())
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps({
        "upstream": {"base_url": "https://api.anthropic.com"},
        "store": {"path": str(tmp_path / "state.db")},
        "sources": {"transcript_root": f"s3://{bucket}/team/transcripts",
                    "artifact_root": f"s3://{bucket}/team/artifacts",
                    "s3": {"endpoint_url": moto.url}}}), encoding="utf-8")
    assert cli_main(["session", SID, "--config", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(s["pointer"], s["status"], s["evidence_sha256"])
            for s in data["state"]["sources"]] == [
        ("transcript:sess-s3:1", "available", sha(line)),
        ("transcript:sess-s3:2", "missing", None),
        ("transcript:sess-other:1", "denied", None)]


# --- end to end: the real proxy with s3:// roots ------------------------------------------------


def test_proxy_with_s3_roots_puts_verified_statuses_into_system(
        moto: MotoServer, proxy_factory: ProxyFactory, upstream_server: UpstreamServer) -> None:
    """The admin API pins a state; the provider receives ``system`` with the pointers verified
    against the object store; ``?resolve=true`` shows the excerpts from it."""
    bucket = f"e2e-{uuid.uuid4().hex[:12]}"
    line = event(1, text="deploy on fridays")

    async def seed() -> None:
        async with setup_client(moto.url) as client:
            await client.create_bucket(Bucket=bucket)
            await put_transcript(client, bucket, [line])
            await put_artifact(client, bucket, "report.txt", REPORT)

    asyncio.run(seed())
    token = "admin-e2e-token-s3-4c1e9a7b3d5f2e8c6a0b"
    proxy = proxy_factory({"sources": {
        "transcript_root": f"s3://{bucket}/team/transcripts",
        "artifact_root": f"s3://{bucket}/team/artifacts",
        "s3": {"endpoint_url": moto.url, "region": "us-east-1"}}}, admin_token=token)
    state = {
        "facts": [{"fact_id": "f1", "content": "deploys happen on fridays",
                   "source_pointer": "transcript:sess-s3:1",
                   "last_confirmed_at": "2025-03-01T12:30:00Z"}],
        "pending_items": [{"item_id": "p1", "description": "publish the report",
                           "source_pointer": f"artifact:sess-s3:report.txt:{REPORT_SHA}",
                           "last_confirmed_at": "2025-03-01T12:31:00Z"},
                          {"item_id": "p2", "description": "read the other's report",
                           "source_pointer": f"artifact:sess-other:report.txt:{REPORT_SHA}",
                           "last_confirmed_at": "2025-03-01T12:32:00Z"}],
    }
    headers = {"Authorization": f"Bearer {token}"}

    async def admin() -> dict[str, Any]:
        async with aiohttp.ClientSession() as http:
            async with http.put(f"{proxy.base_url}/admin/sessions/{SID}/state", json=state,
                                headers=headers) as resp:
                assert resp.status in (200, 201), await resp.text()
            async with http.get(f"{proxy.base_url}/admin/sessions/{SID}/state?resolve=true",
                                headers=headers) as resp:
                assert resp.status == 200, await resp.text()
                body: dict[str, Any] = await resp.json()
                return body

    shown = asyncio.run(admin())
    assert [(s["status"], s["excerpt"]) for s in shown["sources"]] == [
        ("available", "deploy on fridays"), ("available", REPORT.decode()), ("denied", None)]

    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=TEST_API_KEY, max_retries=0)
    with client:
        client.messages.create(model="claude-sonnet-4-5", max_tokens=32, system="Be brief.",
                               messages=[{"role": "user", "content": user_text("deploy?")}],
                               extra_headers={"x-compact-session-id": SID})
    sent = [r.body for r in upstream_server.upstream.message_requests
            if not is_summarizer_request(r.body)]
    assert len(sent) == 1
    block = sent[0]["system"][-1]["text"]
    lines = block.splitlines()
    fact = next(text for text in lines if 'fact_id="f1"' in text)
    assert f"source_status=available evidence_sha256={sha(line)}" in fact
    item = next(text for text in lines if 'item_id="p1"' in text)
    assert f"source_status=available evidence_sha256={REPORT_SHA}" in item
    other = next(text for text in lines if 'item_id="p2"' in text)
    assert "source_status=denied evidence_unavailable=true" in other
    assert "deploy on fridays" not in block  # source text never reaches the prompt
