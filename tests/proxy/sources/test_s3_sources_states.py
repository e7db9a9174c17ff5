"""s3:// source pointers against moto: the five states, change, deletion and the outcome cache."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import pytest

from compactor import DurableContextState, DurableFact, PendingItem
from policies import SourceAccessPolicy
from proxy.sources.s3_client import S3ObjectStore
from proxy.sources.s3_sources import S3SourceResolver, _Body, _Located, new_outcome_cache
from tests.proxy.sources.s3_helpers import (
    MIB,
    OTHER,
    REPORT,
    REPORT_SHA,
    SID,
    T0,
    CountingGets,
    counting,
    event,
    put_artifact,
    put_transcript,
    resolver_for,
    roots,
    sha,
)

if TYPE_CHECKING:
    from types_aiobotocore_s3.client import S3Client

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
