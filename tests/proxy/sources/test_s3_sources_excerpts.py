"""s3:// source pointers against moto: pool excerpts, a 200 MB artifact in bounded memory."""

from __future__ import annotations

import hashlib
import time
import tracemalloc
from pathlib import Path
from typing import TYPE_CHECKING

import compactor
from compactor import DurableContextState, DurableFact, PendingItem
from policies import SourceAccessPolicy
from proxy.sources.resolvers import ResolverPool
from proxy.sources.s3_client import S3ObjectStore
from proxy.sources.s3_roots import S3Settings
from tests.proxy.sources.s3_helpers import (
    MIB,
    REPORT,
    REPORT_SHA,
    SID,
    counting,
    event,
    put_artifact,
    put_transcript,
    sha,
)
from tests.s3_server import MotoServer

if TYPE_CHECKING:
    from types_aiobotocore_s3.client import S3Client

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
