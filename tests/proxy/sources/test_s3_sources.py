"""Source pointers on an object store (``s3://`` roots), against a real S3-compatible server.

``moto`` runs in server mode in its own process on a loopback port (:mod:`tests.s3_server`);
the resolver signs real HTTP requests to it and streams its answers. The redirect tests put a
real aiohttp server on loopback in front. Covered: the five states, a corrupted object, a
vanished one, another session's key, names escaping the session's prefix, redirects, an
unreachable store, the outcome cache, excerpts, a 200 MB artifact hashed in bounded memory,
the configuration, and the proxy end to end.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import tracemalloc
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import anthropic
import pytest
from aiobotocore.session import get_session
from aiohttp import web

import compactor
from compactor import DurableContextState, DurableFact, PendingItem
from policies import SourceAccessPolicy
from proxy.cli.commands import main as cli_main
from proxy.config import Config, ConfigError
from proxy.fake_upstream import is_summarizer_request
from proxy.http.tenants import scoped_key
from proxy.sources.resolvers import ResolverPool
from proxy.sources.s3_client import S3ObjectStore
from proxy.sources.s3_roots import S3Root, S3Settings, parse_s3_root
from proxy.sources.s3_sources import (
    S3SourceResolver,
    _Body,
    _Located,
    new_outcome_cache,
)
from proxy.store.sqlite import SQLiteStateStore
from tests.conftest import TEST_API_KEY, ProxyFactory, UpstreamServer, user_text
from tests.redis_server import free_port
from tests.s3_server import MotoServer, MotoServerUnavailable
from tests.servers import started

if TYPE_CHECKING:
    from types_aiobotocore_s3.client import S3Client

SID = "sess-s3"
OTHER = "sess-other"
REPORT = b"all tests passed\n"
REPORT_SHA = hashlib.sha256(REPORT).hexdigest()
MIB = 1024 * 1024
T0 = datetime(2025, 3, 1, tzinfo=UTC)


# --- the server and the objects --------------------------------------------------------------


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    """One moto server for the module (each test has its own bucket)."""
    with started(MotoServer(), MotoServerUnavailable) as server:
        yield server


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Credentials from the standard variables only (no profile, no instance metadata)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test-key-id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test-secret")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))


#: One aiobotocore session for the module's clients: it loads the S3 model once (a new
#: session per client costs ~0.2 s). It keeps the first credentials it finds, which the
#: autouse fixture sets the same for every test.
SESSION = get_session()


def setup_client(endpoint: str) -> Any:
    """A plain S3 client for putting the test's objects (not the resolver's)."""
    return SESSION.create_client("s3", endpoint_url=endpoint, region_name="us-east-1")


def new_store(endpoint: str) -> S3ObjectStore:
    return S3ObjectStore(S3Settings(endpoint_url=endpoint, region="us-east-1"), session=SESSION)


@pytest.fixture
async def s3(moto: MotoServer) -> AsyncIterator[S3Client]:
    async with setup_client(moto.url) as client:
        yield client


@pytest.fixture
async def bucket(s3: S3Client) -> str:
    name = f"src-{uuid.uuid4().hex[:16]}"
    await s3.create_bucket(Bucket=name)
    return name


@pytest.fixture
async def store(moto: MotoServer) -> AsyncIterator[S3ObjectStore]:
    objects = new_store(moto.url)
    try:
        yield objects
    finally:
        await objects.close()


def roots(bucket: str) -> tuple[S3Root, S3Root]:
    return (parse_s3_root(f"s3://{bucket}/team/transcripts"),
            parse_s3_root(f"s3://{bucket}/team/artifacts/"))


def resolver_for(store: S3ObjectStore, bucket: str, session: str = SID,
                 **kwargs: Any) -> S3SourceResolver:
    transcripts, artifacts = roots(bucket)
    kwargs.setdefault("cache", new_outcome_cache())
    return S3SourceResolver(store, transcripts, artifacts,
                            SourceAccessPolicy().authorizer(session), **kwargs)


def event(sequence: int, session: str = SID, text: str = "") -> str:
    return json.dumps({"sequence": sequence, "session_id": session, "event_id": f"ev-{sequence}",
                       "type": "user", "text": text or f"event {sequence}"})


async def put_transcript(s3: S3Client, bucket: str, lines: list[str], session: str = SID,
                         ending: str = "\n") -> None:
    body = "".join(line + ending for line in lines).encode()
    await s3.put_object(Bucket=bucket, Key=f"team/transcripts/{session}.jsonl", Body=body)


async def put_artifact(s3: S3Client, bucket: str, name: str, data: bytes,
                       session: str = SID) -> None:
    await s3.put_object(Bucket=bucket, Key=f"team/artifacts/{session}/{name}", Body=data)


def sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


# --- the five states ---------------------------------------------------------------------------


async def test_the_five_states(s3: S3Client, bucket: str, store: S3ObjectStore) -> None:
    """available (transcript line, artifact by full digest and by 12-hex prefix), missing,
    corrupt, denied and unsupported, each with the local resolver's meaning."""
    lines = [event(1), event(2, text="deploy on fridays"), event(3)]
    await put_transcript(s3, bucket, lines)
    await put_artifact(s3, bucket, "report.txt", REPORT)
    await put_artifact(s3, bucket, "tampered.txt", b"not the report\n")
    resolver = resolver_for(store, bucket)
    cases = {
        "transcript:sess-s3:2": ("available", sha(lines[1])),
        f"artifact:sess-s3:report.txt:{REPORT_SHA}": ("available", REPORT_SHA),
        f"artifact:sess-s3:report.txt:{REPORT_SHA[:12]}": ("available", REPORT_SHA),
        "transcript:sess-s3:4": ("missing", None),
        f"artifact:sess-s3:absent.txt:{REPORT_SHA}": ("missing", None),
        f"artifact:sess-s3:tampered.txt:{REPORT_SHA}": ("corrupt", None),
        "transcript:sess-s3:0": ("denied", None),
        "https://evil.example/x": ("unsupported", None),
    }
    for pointer, (status, digest) in cases.items():
        result = await resolver.resolve(pointer)
        assert (result.status, result.evidence_sha256) == (status, digest), (pointer, result)
        assert result.pointer == pointer
    missing = await resolver.resolve("transcript:sess-s3:4")
    assert missing.detail == "transcript has 3 events, sequence 4 not found"


async def test_a_transcript_with_no_object_or_bucket_is_missing(
        s3: S3Client, bucket: str, store: S3ObjectStore) -> None:
    resolver = resolver_for(store, bucket)
    assert (await resolver.resolve("transcript:sess-s3:1")).status == "missing"
    transcripts, artifacts = roots(f"gone-{uuid.uuid4().hex[:12]}")
    no_bucket = S3SourceResolver(store, transcripts, artifacts,
                                 SourceAccessPolicy().authorizer(SID))
    result = await no_bucket.resolve("transcript:sess-s3:1")
    assert (result.status, result.detail) == ("missing", "no such object")


@pytest.mark.parametrize("content, detail", [
    ("not json\n", "line 1: not valid JSON"),
    (event(2) + "\n", "line 1: sequence is not 1"),
    (event(1, session=OTHER) + "\n", "line 1: session_id does not match the pointer"),
    (event(1) + "\n[1]\n", "line 2: not a JSON object"),
])
async def test_a_broken_transcript_line_is_corrupt(
        s3: S3Client, bucket: str, store: S3ObjectStore, content: str, detail: str) -> None:
    await s3.put_object(Bucket=bucket, Key=f"team/transcripts/{SID}.jsonl",
                        Body=content.encode())
    result = await resolver_for(store, bucket).resolve("transcript:sess-s3:2")
    assert (result.status, result.detail) == ("corrupt", detail)


async def test_transcript_lines_split_across_chunks_and_crlf_endings(
        s3: S3Client, bucket: str, store: S3ObjectStore) -> None:
    """Tiny chunks split lines anywhere (even between \\r and \\n); the digest is the line's
    without its ending; the last line needs no ending."""
    lines = [event(n, text="x" * n) for n in range(1, 8)]
    body = "\r\n".join(lines).encode()  # no ending after the last line
    await s3.put_object(Bucket=bucket, Key=f"team/transcripts/{SID}.jsonl", Body=body)
    for chunk_size in (1, 7, 64, MIB):
        resolver = resolver_for(store, bucket, chunk_size=chunk_size)
        for sequence in (1, 4, 7):
            result = await resolver.resolve(f"transcript:sess-s3:{sequence}")
            assert (result.status, result.evidence_sha256) == (
                "available", sha(lines[sequence - 1])), (chunk_size, sequence)
        assert (await resolver.resolve("transcript:sess-s3:8")).status == "missing"


async def test_a_transcript_line_over_the_limit_is_corrupt(
        s3: S3Client, bucket: str, store: S3ObjectStore) -> None:
    long_line = event(2, text="y" * 500)
    await put_transcript(s3, bucket, [event(1), long_line, event(3)])
    tight = resolver_for(store, bucket, max_line_bytes=len(long_line) - 1, chunk_size=16)
    result = await tight.resolve("transcript:sess-s3:3")
    assert (result.status, result.detail) == (
        "corrupt", f"line 2: longer than {len(long_line) - 1} bytes")
    exact = resolver_for(store, bucket, max_line_bytes=len(long_line), chunk_size=16)
    assert (await exact.resolve("transcript:sess-s3:3")).status == "available"


# --- change, deletion, the cache ------------------------------------------------------------


class CountingGets(S3SourceResolver):
    """A real resolver that counts the objects it actually reads (GETs)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gets = 0

    async def _get(self, where: _Located, etag: str) -> _Body:
        self.gets += 1
        return await super()._get(where, etag)


def counting(store: S3ObjectStore, bucket: str, **kwargs: Any) -> CountingGets:
    transcripts, artifacts = roots(bucket)
    kwargs.setdefault("cache", new_outcome_cache())
    return CountingGets(store, transcripts, artifacts, SourceAccessPolicy().authorizer(SID),
                        **kwargs)


async def test_an_unchanged_object_is_not_read_again(
        s3: S3Client, bucket: str, store: S3ObjectStore) -> None:
    await put_transcript(s3, bucket, [event(1), event(2)])
    await put_artifact(s3, bucket, "report.txt", REPORT)
    await put_artifact(s3, bucket, "bad.txt", b"bad")
    resolver = counting(store, bucket)
    pointers = [f"artifact:sess-s3:report.txt:{REPORT_SHA}", "transcript:sess-s3:2",
                "transcript:sess-s3:9", f"artifact:sess-s3:bad.txt:{REPORT_SHA}"]
    first = [await resolver.resolve(p) for p in pointers]
    second = [await resolver.resolve(p) for p in pointers]
    assert first == second
    assert [r.status for r in first] == ["available", "available", "missing", "corrupt"]
    assert resolver.gets == 4
    uncached = counting(store, bucket, cache=None)
    for _ in range(2):
        for pointer in pointers:
            await uncached.resolve(pointer)
    assert uncached.gets == 8


class CountingHeads(CountingGets):
    """A real resolver that also counts the HEAD requests it sends."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.heads: list[str] = []

    async def _head_object(self, where: _Located) -> Any:
        self.heads.append(where.key)
        return await super()._head_object(where)


async def test_a_batch_sends_one_head_per_object(
        s3: S3Client, bucket: str, store: S3ObjectStore) -> None:
    """A state's pointers into one transcript share its HEAD (one per object per request);
    each pointer still gets its own status; a missing object is missing for all of its."""
    await put_transcript(s3, bucket, [event(n) for n in range(1, 6)])
    await put_artifact(s3, bucket, "report.txt", REPORT)
    transcripts, artifacts = roots(bucket)
    resolver = CountingHeads(store, transcripts, artifacts, SourceAccessPolicy().authorizer(SID),
                             cache=new_outcome_cache())
    pointer = f"artifact:sess-s3:report.txt:{REPORT_SHA}"
    state = DurableContextState(
        facts=tuple(DurableFact(f"f{n}", "x", f"transcript:sess-s3:{n}", T0)
                    for n in (1, 3, 5, 9)),
        pending_items=(PendingItem("p", "y", pointer, T0),
                       PendingItem("q", "z", "artifact:sess-s3:gone.txt:" + "0" * 12,
                                             T0)))
    first = await resolver.resolve_all(state)
    assert [r.status for r in first] == ["available"] * 3 + ["missing", "available", "missing"]
    assert sorted(resolver.heads) == sorted([f"team/transcripts/{SID}.jsonl",
                                             f"team/artifacts/{SID}/report.txt",
                                             f"team/artifacts/{SID}/gone.txt"])
    assert resolver.gets == 5  # the transcript read once per pointer, the artifact once
    resolver.heads.clear()
    assert await resolver.resolve_all(state) == first  # from the cache: HEADs only
    assert len(resolver.heads) == 3 and resolver.gets == 5
    alone = [await resolver_for(store, bucket).resolve(p) for p in state.source_pointers()]
    assert list(first) == alone


async def test_a_corrupted_object_is_corrupt_even_after_it_was_verified(
        s3: S3Client, bucket: str, store: S3ObjectStore) -> None:
    """Overwriting the object (same size) changes its ETag: the cache misses, the new bytes
    are hashed, and the mismatch is corrupt; the original bytes back are available again."""
    pointer = f"artifact:sess-s3:report.txt:{REPORT_SHA}"
    await put_artifact(s3, bucket, "report.txt", REPORT)
    resolver = counting(store, bucket)
    assert (await resolver.resolve(pointer)).status == "available"
    corrupted = bytearray(REPORT)
    corrupted[3] ^= 0x01
    await put_artifact(s3, bucket, "report.txt", bytes(corrupted))
    result = await resolver.resolve(pointer)
    assert (result.status, result.detail) == (
        "corrupt", "artifact content does not match the pointer's sha256")
    await put_artifact(s3, bucket, "report.txt", REPORT)
    assert (await resolver.resolve(pointer)).status == "available"
    # The same bytes back have the first ETag (their MD5): a hit when still in the same
    # second of Last-Modified, else a read.
    assert resolver.gets in (2, 3)


class ReplacedBeforeRead(S3SourceResolver):
    """A real resolver whose object is overwritten (through the store) between its HEAD and
    its first GET: the race of a writer replacing a source while it is verified."""

    def __init__(self, *args: Any, writer: S3Client, data: bytes, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.writer = writer
        self.data = data
        self.raced = False

    async def _get(self, where: _Located, etag: str) -> _Body:
        if not self.raced:
            self.raced = True
            await self.writer.put_object(Bucket=where.bucket, Key=where.key, Body=self.data)
        return await super()._get(where, etag)


async def test_an_object_replaced_between_head_and_get_is_corrupt_and_not_remembered(
        s3: S3Client, bucket: str, store: S3ObjectStore) -> None:
    """The GET asks for the ETag the HEAD saw (If-Match): the store refuses the replaced
    object (412), so no digest of bytes other than those whose stamps were looked up is
    ever remembered; the next resolution verifies the new object."""
    await put_artifact(s3, bucket, "report.txt", b"the old report\n")
    transcripts, artifacts = roots(bucket)
    cache = new_outcome_cache()
    resolver = ReplacedBeforeRead(store, transcripts, artifacts,
                                  SourceAccessPolicy().authorizer(SID), cache=cache,
                                  writer=s3, data=REPORT)
    pointer = f"artifact:sess-s3:report.txt:{REPORT_SHA}"
    result = await resolver.resolve(pointer)
    assert (result.status, result.detail) == ("corrupt", "object was replaced while being read")
    assert cache is not None and len(cache) == 0
    assert (await resolver.resolve(pointer)).status == "available"


async def test_a_vanished_object_is_missing(
        s3: S3Client, bucket: str, store: S3ObjectStore) -> None:
    await put_transcript(s3, bucket, [event(1)])
    await put_artifact(s3, bucket, "report.txt", REPORT)
    resolver = resolver_for(store, bucket)
    pointers = ["transcript:sess-s3:1", f"artifact:sess-s3:report.txt:{REPORT_SHA}"]
    assert [(await resolver.resolve(p)).status for p in pointers] == ["available"] * 2
    await s3.delete_object(Bucket=bucket, Key=f"team/transcripts/{SID}.jsonl")
    await s3.delete_object(Bucket=bucket, Key=f"team/artifacts/{SID}/report.txt")
    assert [(await resolver.resolve(p)).status for p in pointers] == ["missing"] * 2


# --- authorization, names, redirects, an unreachable store ----------------------------------


async def test_a_key_of_another_session_is_denied_before_any_request(
        s3: S3Client, bucket: str, store: S3ObjectStore) -> None:
    """The other session's objects exist, yet its pointers are denied; against a store that
    cannot be reached the own session's pointer is missing while the other's is still denied
    (so no request was needed to deny it)."""
    await put_transcript(s3, bucket, [event(1, session=OTHER)], session=OTHER)
    await put_artifact(s3, bucket, "report.txt", REPORT, session=OTHER)
    other_pointers = ["transcript:sess-other:1", f"artifact:sess-other:report.txt:{REPORT_SHA}"]
    resolver = resolver_for(store, bucket)
    for pointer in other_pointers:
        result = await resolver.resolve(pointer)
        assert (result.status, result.detail) == ("denied", "not authorized for this session")
    # The owner resolves them: they are there.
    owner = resolver_for(store, bucket, session=OTHER)
    assert [(await owner.resolve(p)).status for p in other_pointers] == ["available"] * 2

    dead = new_store(f"http://127.0.0.1:{free_port()}")
    try:
        offline = resolver_for(dead, bucket)
        own = await offline.resolve("transcript:sess-s3:1")
        assert own.status == "missing" and own.detail.startswith("the object store is unreachable")
        for pointer in other_pointers:
            assert (await offline.resolve(pointer)).detail == "not authorized for this session"
    finally:
        await dead.close()


@pytest.mark.parametrize("pointer", [
    f"artifact:sess-s3:..:{REPORT_SHA}",
    f"artifact:sess-s3:.:{REPORT_SHA}",
    f"artifact:sess-s3:../sess-other/report.txt:{REPORT_SHA}",
    f"artifact:sess-s3:%2e%2e%2fsess-other%2freport.txt:{REPORT_SHA}",
    f"artifact:sess-s3:..%2Fsess-other%2Freport.txt:{REPORT_SHA}",
    f"artifact:sess-s3:a%2Fb:{REPORT_SHA}",
    f"artifact:sess-s3:..%5creport.txt:{REPORT_SHA}",
    f"artifact:sess-s3:/team/artifacts/sess-other/report.txt:{REPORT_SHA}",
    f"artifact:sess-s3:..\\sess-other\\report.txt:{REPORT_SHA}",
    f"artifact:..:report.txt:{REPORT_SHA}",
    f"artifact:sess-s3/../sess-other:report.txt:{REPORT_SHA}",
    "transcript:../sess-other:1",
    "transcript:sess-s3/../sess-other:1",
    "transcript:%2e%2e:1",
])
async def test_names_escaping_the_session_prefix_are_denied(
        s3: S3Client, bucket: str, store: S3ObjectStore, pointer: str) -> None:
    """Pointers carry names, never URLs: traversal, absolute and percent-encoded names are
    refused before a key is built, even where the key they aim at exists (S3 keys may
    literally contain ``..``)."""
    await put_artifact(s3, bucket, "report.txt", REPORT, session=OTHER)
    await s3.put_object(Bucket=bucket, Key=f"team/artifacts/{SID}/../{OTHER}/report.txt",
                        Body=REPORT)
    await s3.put_object(Bucket=bucket, Key="team/transcripts/../sess-other.jsonl",
                        Body=(event(1, session="..") + "\n").encode())
    result = await resolver_for(store, bucket).resolve(pointer)
    assert result.status == "denied", result
    assert result.detail.startswith(("malformed pointer", "not authorized")), result


class RedirectingServer:
    """A real HTTP server on loopback answering every request with a redirect; counts them."""

    def __init__(self, status: int, location: str | None, headers: dict[str, str]) -> None:
        self.status = status
        self.location = location
        self.headers = headers
        self.requests: list[str] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append(f"{request.method} {request.path}")
        headers = dict(self.headers)
        if self.location is not None:
            headers["Location"] = self.location + request.path_qs
        body = b""
        if request.method != "HEAD":
            code = {301: "PermanentRedirect", 400: "AuthorizationHeaderMalformed"}.get(
                self.status, "TemporaryRedirect")
            body = (f"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code>"
                    "<Message>Please use the other endpoint.</Message>"
                    "<Region>eu-west-1</Region></Error>").encode()
        return web.Response(status=self.status, headers=headers, body=body,
                            content_type="application/xml")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        port = free_port()
        await web.TCPSite(self.runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@pytest.mark.parametrize("status, region_header", [
    (307, False),   # Location to the real store, which holds the object
    (302, False),
    (301, True),    # S3's wrong-region answer: botocore would re-send it to that region
    (307, True),
    (400, True),    # a wrong-region answer without a 3xx: the re-sent request is refused
])
async def test_a_redirect_is_denied_and_never_followed(
        s3: S3Client, bucket: str, moto: MotoServer, status: int, region_header: bool) -> None:
    await put_artifact(s3, bucket, "report.txt", REPORT)
    await put_transcript(s3, bucket, [event(1)])
    target = RedirectingServer(200, None, {})  # where Location points: must see nothing
    await target.start()
    headers = {"x-amz-bucket-region": "eu-west-1"} if region_header else {}
    redirector = RedirectingServer(status, target.url if status < 400 else None, headers)
    await redirector.start()
    objects = new_store(redirector.url)
    try:
        resolver = resolver_for(objects, bucket)
        for pointer in (f"artifact:sess-s3:report.txt:{REPORT_SHA}", "transcript:sess-s3:1"):
            result = await resolver.resolve(pointer)
            assert (result.status, result.detail) == (
                "denied", "the object store answered with a redirect (not followed)"), result
        assert target.requests == []
        # One HEAD per pointer: no second attempt, no probe of the bucket's region.
        assert redirector.requests == [f"HEAD /{bucket}/team/artifacts/{SID}/report.txt",
                                       f"HEAD /{bucket}/team/transcripts/{SID}.jsonl"]
        # The same store reached directly has the objects.
        direct = resolver_for(new_store(moto.url), bucket)
        assert (await direct.resolve("transcript:sess-s3:1")).status == "available"
        await direct._store.close()
    finally:
        await objects.close()
        await redirector.stop()
        await target.stop()


async def test_an_unreachable_store_is_missing_and_not_remembered(
        s3: S3Client, bucket: str, moto: MotoServer) -> None:
    """A refused connection is missing; the same resolver sees the object once it is back
    (here: the cache shared with a resolver on the reachable endpoint kept no failure)."""
    await put_artifact(s3, bucket, "report.txt", REPORT)
    cache = new_outcome_cache()
    pointer = f"artifact:sess-s3:report.txt:{REPORT_SHA}"
    dead = new_store(f"http://127.0.0.1:{free_port()}")
    try:
        started = time.monotonic()
        result = await resolver_for(dead, bucket, cache=cache).resolve(pointer)
        assert result.status == "missing"
        assert result.detail.startswith("the object store is unreachable")
        assert time.monotonic() - started < 10
    finally:
        await dead.close()
    assert cache is not None and len(cache) == 0
    live = new_store(moto.url)
    try:
        assert (await resolver_for(live, bucket, cache=cache).resolve(pointer)).status == \
            "available"
    finally:
        await live.close()


async def test_bad_credentials_are_denied(s3: S3Client, bucket: str, moto: MotoServer,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """No credentials at all (a fresh session looks them up): denied."""
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    await put_artifact(s3, bucket, "report.txt", REPORT)
    objects = S3ObjectStore(S3Settings(endpoint_url=moto.url))
    try:
        result = await resolver_for(objects, bucket).resolve(
            f"artifact:sess-s3:report.txt:{REPORT_SHA}")
        assert (result.status, result.detail) == ("denied", "no credentials for the object store")
    finally:
        await objects.close()


async def set_moto_auth(moto: MotoServer, checked_after: str) -> None:
    """Turn moto's request authentication on (``"0"``: from the next request) or off
    (``"inf"``) through its own API."""
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{moto.url}/moto-api/reset-auth", data=checked_after) as resp:
            assert resp.status == 200, await resp.text()


async def test_forged_or_unknown_credentials_are_denied(
        s3: S3Client, bucket: str, moto: MotoServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """With moto checking signatures against its IAM users: the user's real key reads the
    object; the same key id with a forged secret (a signature that does not verify) and an
    unknown key id are refused by the store: denied."""
    await put_artifact(s3, bucket, "report.txt", REPORT)
    async with SESSION.create_client("iam", endpoint_url=moto.url,
                                     region_name="us-east-1") as iam:
        await iam.create_user(UserName="reader")
        await iam.put_user_policy(UserName="reader", PolicyName="read", PolicyDocument=json.dumps(
            {"Version": "2012-10-17",
             "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        key = (await iam.create_access_key(UserName="reader"))["AccessKey"]
    pointer = f"artifact:sess-s3:report.txt:{REPORT_SHA}"
    cases = [(key["AccessKeyId"], key["SecretAccessKey"], "available"),
             (key["AccessKeyId"], "forged" + key["SecretAccessKey"][6:], "denied"),
             ("AKIAUNKNOWN000000000", key["SecretAccessKey"], "denied")]
    await set_moto_auth(moto, "0")
    try:
        for key_id, secret, status in cases:
            monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
            monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
            # A fresh session: it looks the credentials up again.
            objects = S3ObjectStore(S3Settings(endpoint_url=moto.url, region="us-east-1"))
            try:
                result = await resolver_for(objects, bucket).resolve(pointer)
            finally:
                await objects.close()
            assert result.status == status, (key_id, result)
            if status == "denied":
                assert result.detail.startswith("the object store refused access"), result
    finally:
        await set_moto_auth(moto, "inf")


# --- excerpts (the admin API and the console) ------------------------------------------------


async def test_pool_excerpts_and_statuses_for_s3_roots(
        s3: S3Client, bucket: str, moto: MotoServer) -> None:
    lines = [event(1, text="deploy on fridays")]
    await put_transcript(s3, bucket, lines)
    await put_artifact(s3, bucket, "report.txt", REPORT)
    state = DurableContextState(
        facts=(DurableFact("f1", "deploys", "transcript:sess-s3:1", "2025-03-01T12:30:00Z"),
               DurableFact("f2", "elsewhere", "transcript:sess-other:1",
                           "2025-03-01T12:30:00Z")),
        pending_items=(PendingItem("p1", "publish", f"artifact:sess-s3:report.txt:{REPORT_SHA}",
                                   "2025-03-01T12:31:00Z"),),
    )
    pool = ResolverPool(f"s3://{bucket}/team/transcripts", f"s3://{bucket}/team/artifacts",
                        SourceAccessPolicy(), s3=S3Settings(endpoint_url=moto.url))
    try:
        statuses = await pool.resolve(SID, state, tenant="none")
        assert [(r.status, r.evidence_sha256) for r in statuses] == [
            ("available", sha(lines[0])), ("denied", None), ("available", REPORT_SHA)]
        excerpts = await pool.excerpts(SID, state, tenant="none", max_chars=10)
        assert [e.text for e in excerpts] == ["deploy on ", None, "all tests "]
        assert [e.resolution for e in excerpts] == list(statuses)
        text = compactor.render_durable_context(state, source_resolutions=statuses)
        assert f"source_status=available evidence_sha256={REPORT_SHA}" in text
        # A tenant reads its own prefix only: the shared prefix's objects are not its own.
        tenant = "t0123456789abcdef"
        assert [r.status for r in await pool.resolve(SID, state, tenant=tenant)] == [
            "missing", "denied", "missing"]
        await put_transcript(s3, bucket, lines, session=f"{tenant}/{SID}")
        mine = await pool.excerpts(SID, state, tenant=tenant, max_chars=10)
        assert [(e.resolution.status, e.text) for e in mine] == [
            ("available", "deploy on "), ("denied", None), ("missing", None)]
    finally:
        await pool.close()


# --- a 200 MB artifact in bounded memory --------------------------------------------------------


PART_BYTES = 25 * MIB
LARGE_BYTES = 200 * MIB


async def upload_large(s3: S3Client, bucket: str, key: str) -> str:
    """A 200 MB object by multipart upload, one 25 MiB part at a time (moto takes ~3 s to
    receive them and ~3 s to join them); returns its sha256."""
    upload = await s3.create_multipart_upload(Bucket=bucket, Key=key)
    hasher = hashlib.sha256()
    parts = []
    for number in range(1, LARGE_BYTES // PART_BYTES + 1):
        part = hashlib.sha256(number.to_bytes(4, "big")).digest() * (PART_BYTES // 32)
        hasher.update(part)
        answer = await s3.upload_part(Bucket=bucket, Key=key, PartNumber=number,
                                      UploadId=upload["UploadId"], Body=part)
        parts.append({"PartNumber": number, "ETag": answer["ETag"]})
        del part
    await s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload["UploadId"],
                                       MultipartUpload={"Parts": parts})
    return hasher.hexdigest()


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{field} not in /proc/self/status")


async def test_a_200_mb_artifact_is_hashed_in_bounded_memory(
        s3: S3Client, bucket: str, store: S3ObjectStore) -> None:
    digest = await upload_large(s3, bucket, f"team/artifacts/{SID}/big.bin")
    head = await s3.head_object(Bucket=bucket, Key=f"team/artifacts/{SID}/big.bin")
    assert head["ContentLength"] == LARGE_BYTES
    resolver = counting(store, bucket)
    pointer = f"artifact:sess-s3:big.bin:{digest}"
    # Warm the client (its creation allocates too) on another pointer.
    await resolver.resolve("transcript:sess-s3:1")
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak RSS (VmHWM)
    rss_before = _rss_kib("VmRSS")
    tracemalloc.start()
    started = time.monotonic()
    try:
        result = await resolver.resolve(pointer)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    elapsed = time.monotonic() - started
    rss_growth = (_rss_kib("VmHWM") - rss_before) * 1024
    print(f"\n200 MB artifact: {elapsed:.2f}s, tracemalloc peak {peak / MIB:.1f} MiB, "
          f"peak RSS growth {rss_growth / MIB:.1f} MiB")
    assert (result.status, result.evidence_sha256) == ("available", digest)
    assert peak < 16 * MIB, f"tracemalloc peak {peak} bytes"
    assert rss_growth < 64 * MIB, f"peak RSS grew by {rss_growth} bytes"
    # A second resolution of the unchanged object does not read it again.
    assert await resolver.resolve(pointer) == result
    assert resolver.gets == 1
    # The same object under a pointer with another digest: read again, corrupt.
    assert (await resolver.resolve(f"artifact:sess-s3:big.bin:{'0' * 64}")).status == "corrupt"


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
