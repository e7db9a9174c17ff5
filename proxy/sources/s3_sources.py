"""Source pointers resolved against an S3-compatible object store (``s3://`` roots).

The object-store twin of :class:`compactor.SourcePointerResolver` (the same contract and five
statuses, through aiobotocore on the event loop): parse, authorize, check the key lies under
the session's prefix, ``HEAD``, then a streamed ``GET`` ``If-Match`` that ETag. Verified
outcomes are remembered by ETag and Last-Modified. Statuses for operators: docs/admin.md.
"""

from __future__ import annotations

import asyncio
import codecs
import hashlib
import json
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from cachetools import LRUCache

import compactor
from compactor import (
    ArtifactPointer,
    SourceExcerpt,
    SourcePointer,
    SourceResolution,
    TranscriptPointer,
)
from compactor._resolver import (
    DEFAULT_CACHE_ENTRIES,
    DEFAULT_CHUNK_SIZE,
    DEFAULT_EXCERPT_CHARS,
    DEFAULT_MAX_LINE_BYTES,
    checked_line,
    checked_pointer,
)
from compactor._source_files import Outcome as _Outcome
from compactor._source_files import ResolutionStatus
from proxy.sources.s3_client import CONCURRENCY, STORE_ERRORS, S3ObjectStore, store_error_outcome
from proxy.sources.s3_roots import S3Root

__all__ = ["OutcomeCache", "S3SourceResolver", "new_outcome_cache"]

# (pointer, bucket, key, etag, last-modified, size, version id) -> (status, digest, detail)
_CacheKey = tuple[str, str, str, str, str, int, str]
_Cached = tuple[ResolutionStatus, str | None, str]
OutcomeCache = LRUCache[_CacheKey, _Cached]

_T = TypeVar("_T")


def new_outcome_cache(entries: int = DEFAULT_CACHE_ENTRIES) -> OutcomeCache | None:
    """An outcome cache of ``entries`` verified outcomes (``None`` for 0: no caching)."""
    if entries < 0:
        raise ValueError("cache entries must not be negative")
    return LRUCache(maxsize=entries) if entries else None


class _Body(Protocol):
    async def read(self, amt: int | None = ...) -> bytes: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class _Located:
    """The object a pointer names."""

    bucket: str
    key: str


#: One batch's HEAD requests, by object (:meth:`S3SourceResolver._head`).
_Heads = dict[_Located, "asyncio.Future[Mapping[str, Any]]"]


class S3SourceResolver:
    """Checks source pointers against the objects they name. ``authorize`` must answer
    exactly ``True`` before any request (fail closed); ``cache`` may be shared by several
    resolvers (its keys hold the pointer), ``None`` reads every time."""

    def __init__(self, store: S3ObjectStore, transcript_root: S3Root, artifact_root: S3Root,
                 authorize: Callable[[SourcePointer], bool], *,
                 cache: OutcomeCache | None = None, chunk_size: int = DEFAULT_CHUNK_SIZE,
                 max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        if chunk_size < 1 or max_line_bytes < 1:
            raise ValueError("chunk_size and max_line_bytes must be positive")
        self._store = store
        self._transcript_root = transcript_root
        self._artifact_root = artifact_root
        self._authorize = authorize
        self._cache = cache
        self._chunk_size = chunk_size
        self._max_line_bytes = max_line_bytes

    async def resolve(self, pointer: str) -> SourceResolution:
        """Resolve one pointer string; never raises for a bad pointer or a bad object."""
        return await self._resolve(pointer, {})

    async def _resolve(self, pointer: str, heads: _Heads) -> SourceResolution:
        parsed = checked_pointer(pointer, self._authorize)
        if isinstance(parsed, SourceResolution):
            return parsed
        shown = pointer
        try:
            if isinstance(parsed, TranscriptPointer):
                digest = await self._resolve_transcript(parsed, heads)
            else:
                digest = await self._resolve_artifact(parsed, heads)
        except _Outcome as outcome:
            return SourceResolution(shown, outcome.status, None, outcome.detail)
        except STORE_ERRORS as exc:
            failure = store_error_outcome(exc)
            return SourceResolution(shown, failure.status, None, failure.detail)
        return SourceResolution(shown, "available", digest, "verified")

    async def resolve_all(self, state: compactor.DurableContextState
                          ) -> tuple[SourceResolution, ...]:
        """Every distinct pointer of ``state``, first-seen order (as
        :func:`compactor.resolve_durable_sources`): :meth:`resolve_pointers`."""
        return await self.resolve_pointers(state.source_pointers())

    async def resolve_pointers(self, pointers: Iterable[str]) -> tuple[SourceResolution, ...]:
        """:meth:`resolve` each pointer, :data:`CONCURRENCY` at a time. The pointers that name
        one object (a session's facts in its one transcript) share its HEAD: one per object
        per request, not one per pointer."""
        heads: _Heads = {}
        return await _bounded(self._resolve(p, heads) for p in pointers)

    def _transcript_object(self, pointer: TranscriptPointer) -> _Located:
        root = self._transcript_root
        key = root.transcript_key(pointer.session_id)
        _check_contained(key, root.prefix, f"{pointer.session_id}.jsonl")
        return _Located(root.bucket, key)

    def _artifact_object(self, pointer: ArtifactPointer) -> _Located:
        root = self._artifact_root
        session_prefix = root.session_prefix(pointer.session_id)
        key = root.artifact_key(pointer.session_id, pointer.filename)
        _check_contained(key, session_prefix, pointer.filename)
        return _Located(root.bucket, key)

    async def _resolve_transcript(self, pointer: TranscriptPointer, heads: _Heads) -> str:
        async def scan(body: _Body) -> str:
            return hashlib.sha256(await self._target_line(body, pointer)).hexdigest()

        return await self._lookup(self._transcript_object(pointer), str(pointer), scan, heads)

    async def _resolve_artifact(self, pointer: ArtifactPointer, heads: _Heads) -> str:
        async def verify(body: _Body) -> str:
            hasher = hashlib.sha256()
            while chunk := await body.read(self._chunk_size):
                hasher.update(chunk)
            digest = hasher.hexdigest()
            if not digest.startswith(pointer.sha256):
                raise _Outcome("corrupt", "artifact content does not match the pointer's sha256")
            return digest

        return await self._lookup(self._artifact_object(pointer), str(pointer), verify, heads)

    async def _lookup(self, where: _Located, pointer: str,
                      verify: Callable[[_Body], Awaitable[str]], heads: _Heads) -> str:
        """HEAD the object (once per batch), reuse its remembered outcome or GET it
        (``If-Match`` its ETag) and run ``verify`` on the body."""
        head = await self._head(where, heads)
        etag = head.get("ETag") or ""
        modified = head.get("LastModified")
        key: _CacheKey = (pointer, where.bucket, where.key, etag,
                          modified.isoformat() if modified is not None else "",
                          int(head.get("ContentLength") or 0), head.get("VersionId") or "")
        # Without an ETag the object's identity is unknown: read it, remember nothing.
        cache = self._cache if etag else None
        cached = cache.get(key) if cache is not None else None
        if cached is not None:
            status, digest, detail = cached
            if digest is None:
                raise _Outcome(status, detail)
            return digest
        body = await self._get(where, etag)
        try:
            digest = await verify(body)
        except _Outcome as outcome:
            if cache is not None:
                cache[key] = (outcome.status, None, outcome.detail)
            raise
        finally:
            body.close()
        if cache is not None:
            cache[key] = ("available", digest, "verified")
        return digest

    async def _head(self, where: _Located, heads: _Heads) -> Mapping[str, Any]:
        """The object's HEAD, asked once per batch (``heads``: the batch's, by object: its
        pointers wait on the same request, and share its answer or its error)."""
        found = heads.get(where)
        if found is None:
            found = heads[where] = asyncio.ensure_future(self._head_object(where))
        return await found

    async def _head_object(self, where: _Located) -> Mapping[str, Any]:
        client = await self._store.client()
        head: Mapping[str, Any] = await client.head_object(Bucket=where.bucket, Key=where.key)
        return head

    async def _get(self, where: _Located, etag: str) -> _Body:
        """The object's body, streaming; a GET whose object changed since ``etag`` is
        refused by the store (412: ``corrupt``, never remembered)."""
        client = await self._store.client()
        if_match = {"IfMatch": etag} if etag else {}
        response = await client.get_object(Bucket=where.bucket, Key=where.key, **if_match)
        body: _Body = response["Body"]
        return body

    async def _target_line(self, body: _Body, pointer: TranscriptPointer) -> bytes:
        """The event line the pointer names (without its line ending), every line before it
        checked; the local resolver's loop, its ``readline`` done on the body's chunks."""
        limit = self._max_line_bytes
        buffer = bytearray()
        eof = False
        for expected in range(1, pointer.sequence + 1):
            # The next line with its ending, or its first limit + 2 bytes (room for "\r\n").
            searched = 0
            while (end := buffer.find(b"\n", searched, limit + 2)) < 0 \
                    and len(buffer) < limit + 2 and not eof:
                searched = len(buffer)
                chunk = await body.read(self._chunk_size)
                buffer += chunk
                eof = not chunk
            end = end + 1 if end >= 0 else min(limit + 2, len(buffer))
            line = checked_line(bytes(buffer[:end]), expected, pointer, limit)
            del buffer[:end]
            if expected == pointer.sequence:
                return line
        raise AssertionError("unreachable: sequence >= 1")  # pragma: no cover

    async def excerpt(self, pointer: str, *,
                      max_chars: int = DEFAULT_EXCERPT_CHARS) -> SourceExcerpt:
        """Resolve ``pointer``; for an available source, add the start of its text, read
        again and shown only when that read has the digest just verified."""
        if max_chars < 0:
            raise ValueError(f"max_chars must be >= 0, got {max_chars}")
        resolution = await self.resolve(pointer)
        if resolution.status != "available":
            return SourceExcerpt(resolution, None)
        # resolve() parsed and authorized this very pointer.
        parsed = compactor.parse_source_pointer(pointer)
        try:
            if isinstance(parsed, TranscriptPointer):
                digest, text = await self._transcript_excerpt(parsed, max_chars)
            else:
                digest, text = await self._artifact_excerpt(parsed, max_chars)
        except (_Outcome, *STORE_ERRORS):
            return SourceExcerpt(resolution, None)
        if digest != resolution.evidence_sha256:  # changed since it was verified
            return SourceExcerpt(resolution, None)
        return SourceExcerpt(resolution, text)

    async def excerpt_pointers(self, pointers: Iterable[str], *,
                               max_chars: int = DEFAULT_EXCERPT_CHARS
                               ) -> tuple[SourceExcerpt, ...]:
        """:meth:`excerpt` of each pointer, :data:`CONCURRENCY` at a time."""
        return await _bounded(self.excerpt(p, max_chars=max_chars) for p in pointers)

    async def _transcript_excerpt(self, pointer: TranscriptPointer,
                                  max_chars: int) -> tuple[str, str]:
        body = await self._get(self._transcript_object(pointer), "")
        try:
            line = await self._target_line(body, pointer)
        finally:
            body.close()
        event = json.loads(line)  # checked by _target_line: a JSON object
        text = event.get("text")
        if not isinstance(text, str):
            text = event.get("content")
        if not isinstance(text, str):
            text = line.decode("utf-8", errors="replace")
        return hashlib.sha256(line).hexdigest(), text[:max_chars]

    async def _artifact_excerpt(self, pointer: ArtifactPointer,
                                max_chars: int) -> tuple[str, str]:
        wanted = max_chars * 4  # the most bytes max_chars characters take in UTF-8
        head = bytearray()
        hasher = hashlib.sha256()
        size = 0
        body = await self._get(self._artifact_object(pointer), "")
        try:
            while chunk := await body.read(self._chunk_size):
                hasher.update(chunk)
                size += len(chunk)
                if len(head) < wanted:
                    head += chunk[: wanted - len(head)]
        finally:
            body.close()
        # A character cut in two at the end of the head is left out, not replaced.
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        text = decoder.decode(bytes(head), final=size <= wanted)
        return hasher.hexdigest(), text[:max_chars]


async def _bounded(calls: Iterable[Coroutine[Any, Any, _T]]) -> tuple[_T, ...]:
    """Await ``calls``, at most :data:`CONCURRENCY` at once; results in their order."""
    gate = asyncio.Semaphore(CONCURRENCY)

    async def run(call: Coroutine[Any, Any, _T]) -> _T:
        async with gate:
            return await call

    return tuple(await asyncio.gather(*(run(call) for call in calls)))


def _check_contained(key: str, prefix: str, name: str) -> None:
    """``key`` must be ``prefix`` followed by one plain name: nothing that climbs out."""
    rest = key[len(prefix):] if key.startswith(prefix) else None
    if rest != name or not rest or "/" in rest or rest in (".", ".."):
        raise _Outcome("denied", "key leads outside the session's prefix")


