"""What the s3:// source tests share: ids, the objects they put, S3 clients and resolvers."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from aiobotocore.session import get_session

from policies import SourceAccessPolicy
from proxy.sources.s3_client import S3ObjectStore
from proxy.sources.s3_roots import S3Root, S3Settings, parse_s3_root
from proxy.sources.s3_sources import S3SourceResolver, _Body, _Located, new_outcome_cache

if TYPE_CHECKING:
    from types_aiobotocore_s3.client import S3Client


SID = "sess-s3"
OTHER = "sess-other"
REPORT = b"all tests passed\n"
REPORT_SHA = hashlib.sha256(REPORT).hexdigest()
MIB = 1024 * 1024
T0 = datetime(2025, 3, 1, tzinfo=UTC)


#: One aiobotocore session for the module's clients: it loads the S3 model once (a new
#: session per client costs ~0.2 s). It keeps the first credentials it finds, which the
#: autouse fixture sets the same for every test.
SESSION = get_session()


def setup_client(endpoint: str) -> Any:
    """A plain S3 client for putting the test's objects (not the resolver's)."""
    return SESSION.create_client("s3", endpoint_url=endpoint, region_name="us-east-1")


def new_store(endpoint: str) -> S3ObjectStore:
    return S3ObjectStore(S3Settings(endpoint_url=endpoint, region="us-east-1"), session=SESSION)


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
