"""Resolve source pointers against the transcript and artifact roots: the only part of
``compactor`` that reads files.

Resolving never raises for a bad pointer or file: it parses, authorizes, then touches the disk
(:mod:`._source_files`), and says ``available`` (with ``evidence_sha256``), ``missing``,
``denied``, ``corrupt`` or ``unsupported`` (the rules: docs/admin.md). Outcomes are remembered
by the file's identity and change stamps. Excerpts are for an operator's eyes only.
"""

from __future__ import annotations

import codecs
import errno
import functools
import hashlib
import io
import json
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, get_args

from cachetools import LRUCache

from ._pointers import (
    ArtifactPointer,
    SourcePointer,
    TranscriptPointer,
    UnsupportedPointerError,
    parse_source_pointer,
)
from ._source_files import ContainedFile, FileChecks, Outcome, ResolutionStatus

if TYPE_CHECKING:
    from ._state import DurableContextState

__all__ = ["SourceExcerpt", "SourcePointerResolver", "SourceResolution",
           "resolve_durable_sources"]

_STATUSES: frozenset[str] = frozenset(get_args(ResolutionStatus))
_SHA256_HEX_RE = re.compile(r"[0-9a-f]{64}", re.ASCII)

DEFAULT_CHUNK_SIZE = 1024 * 1024
DEFAULT_MAX_LINE_BYTES = 32 * 1024 * 1024
DEFAULT_CACHE_ENTRIES = 4096
#: The most characters :meth:`SourcePointerResolver.excerpt` shows by default.
DEFAULT_EXCERPT_CHARS = 500

@dataclass(frozen=True, slots=True)
class SourceResolution:
    """What resolving one pointer found: ``evidence_sha256`` (64 hex) only when
    ``available``; ``detail`` a short reason, never file content."""

    pointer: str
    status: ResolutionStatus
    evidence_sha256: str | None
    detail: str

    def __post_init__(self) -> None:
        if self.status not in _STATUSES:
            raise ValueError(f"status: unknown status {self.status!r}")
        if self.status == "available":
            if not isinstance(self.evidence_sha256, str) or not _SHA256_HEX_RE.fullmatch(
                self.evidence_sha256
            ):
                raise ValueError("evidence_sha256: must be 64 lowercase hex when available")
        elif self.evidence_sha256 is not None:
            raise ValueError(f"evidence_sha256: must be None when status is {self.status}")


@dataclass(frozen=True, slots=True)
class SourceExcerpt:
    """A pointer's resolution and the start of its source's text (the transcript event's
    ``text``, else its line; the artifact's start), for an operator only; ``text`` is None
    unless the source is available and unchanged since it was verified."""

    resolution: SourceResolution
    text: str | None


# (pointer, st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns) -> (status, digest, detail)
_CacheKey = tuple[str, int, int, int, int, int]
_Cached = tuple[ResolutionStatus, str | None, str]


class PointerResolver(Protocol):
    """Anything that resolves pointer strings, like :class:`SourcePointerResolver`."""

    def resolve(self, pointer: str) -> SourceResolution:
        """Resolve one pointer string; never raises for a bad pointer."""
        ...


class SourcePointerResolver:
    """Checks source pointers against the files they name, under ``transcript_root``
    (``<session_id>.jsonl``) and ``artifact_root`` (``<session_id>/<filename>``).

    ``authorize`` sees each parsed pointer before any file access; only ``True`` allows it.
    Up to ``cache_entries`` outcomes (0: none) are kept by pointer and the file's device,
    inode, size, mtime and ctime: a hit still opens and ``fstat``s the file, but reads
    nothing. Thread-safe.
    """

    def __init__(
        self,
        transcript_root: str | os.PathLike[str],
        artifact_root: str | os.PathLike[str],
        authorize: Callable[[SourcePointer], bool],
        *,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        cache_entries: int = DEFAULT_CACHE_ENTRIES,
    ) -> None:
        if chunk_size < 1 or max_line_bytes < 1:
            raise ValueError("chunk_size and max_line_bytes must be positive")
        if cache_entries < 0:
            raise ValueError("cache_entries must not be negative")
        # Each batch opens the roots anew, so a root created or re-linked later is seen.
        self._transcript_root = os.path.abspath(os.fspath(transcript_root))
        self._artifact_root = os.path.abspath(os.fspath(artifact_root))
        self._authorize = authorize
        self._chunk_size = chunk_size
        self._max_line_bytes = max_line_bytes
        # cachetools' LRU is not thread-safe; the resolver runs in worker threads.
        self._cache: LRUCache[_CacheKey, _Cached] | None = (
            LRUCache(maxsize=cache_entries) if cache_entries else None)
        self._cache_lock = threading.Lock()

    def resolve(self, pointer: str) -> SourceResolution:
        """Resolve one pointer string; never raises for a bad pointer or file."""
        with FileChecks() as checks:
            return self._resolve(pointer, checks)

    def resolve_all(self, pointers: Iterable[str]) -> tuple[SourceResolution, ...]:
        """:meth:`resolve` each pointer, as one batch: a file that several pointers name is
        checked once for all of them (:class:`FileChecks`)."""
        with FileChecks() as checks:
            return tuple(self._resolve(pointer, checks) for pointer in pointers)

    def _resolve(self, pointer: str, checks: FileChecks) -> SourceResolution:
        parsed = checked_pointer(pointer, self._authorize)
        if isinstance(parsed, SourceResolution):
            return parsed
        shown = pointer
        try:
            if isinstance(parsed, TranscriptPointer):
                digest = self._resolve_transcript(parsed, checks)
            else:
                digest = self._resolve_artifact(parsed, checks)
        except Outcome as outcome:
            return SourceResolution(shown, outcome.status, None, outcome.detail)
        except OSError as exc:
            status, detail = _os_error_outcome(exc)
            return SourceResolution(shown, status, None, detail)
        return SourceResolution(shown, "available", digest, "verified")

    def _place(self, pointer: SourcePointer) -> tuple[str, str]:
        """The root of the file ``pointer`` names and its path beneath it (a link there is
        refused)."""
        if isinstance(pointer, TranscriptPointer):
            return self._transcript_root, pointer.session_id + ".jsonl"
        return self._artifact_root, f"{pointer.session_id}/{pointer.filename}"

    # --- transcripts ----------------------------------------------------------------------

    def _resolve_transcript(self, pointer: TranscriptPointer, checks: FileChecks) -> str:
        def scan(handle: io.FileIO) -> str:
            # Not closed: the raw handle stays open for the after-read check.
            reader = io.BufferedReader(handle, buffer_size=self._chunk_size)
            return self._scan_transcript(reader, pointer)

        return self._lookup(pointer, scan, checks)

    def _scan_transcript(self, reader: io.BufferedReader[io.FileIO],
                         pointer: TranscriptPointer) -> str:
        return hashlib.sha256(self._target_line(reader, pointer)).hexdigest()

    def _target_line(self, reader: io.BufferedReader[io.FileIO],
                     pointer: TranscriptPointer) -> bytes:
        """The event line the pointer names (without its line ending), every line before it
        checked."""
        limit = self._max_line_bytes
        for expected in range(1, pointer.sequence + 1):
            # Room for the line ending.
            line = checked_line(reader.readline(limit + 2), expected, pointer, limit)
            if expected == pointer.sequence:
                return line
        raise AssertionError("unreachable: sequence >= 1")  # pragma: no cover

    # --- artifacts ------------------------------------------------------------------------

    def _resolve_artifact(self, pointer: ArtifactPointer, checks: FileChecks) -> str:
        def verify(handle: io.FileIO) -> str:
            hasher = hashlib.sha256()
            for chunk in self._read_chunks(handle):
                hasher.update(chunk)
            digest = hasher.hexdigest()
            if not digest.startswith(pointer.sha256):
                raise Outcome("corrupt", "artifact content does not match the pointer's sha256")
            return digest

        return self._lookup(pointer, verify, checks)

    # --- excerpts (for an operator, never for a prompt) -------------------------------------

    def excerpt(self, pointer: str, *, max_chars: int = DEFAULT_EXCERPT_CHARS) -> SourceExcerpt:
        """Resolve ``pointer`` and, for an available source, read the start of its text
        (a negative ``max_chars`` is a ``ValueError``)."""
        if max_chars < 0:
            raise ValueError(f"max_chars must be >= 0, got {max_chars}")
        resolution = self.resolve(pointer)
        if resolution.status != "available":
            return SourceExcerpt(resolution, None)
        parsed = parse_source_pointer(pointer)
        try:
            with FileChecks() as checks, ContainedFile(*self._place(parsed), checks) as opened:
                if isinstance(parsed, TranscriptPointer):
                    digest, text = self._transcript_excerpt(opened, parsed, max_chars)
                else:
                    digest, text = self._artifact_excerpt(opened, max_chars)
                opened.check_unchanged()
        except (Outcome, OSError):
            return SourceExcerpt(resolution, None)
        if digest != resolution.evidence_sha256:  # changed since it was verified
            return SourceExcerpt(resolution, None)
        return SourceExcerpt(resolution, text)

    def _transcript_excerpt(self, opened: ContainedFile, pointer: TranscriptPointer,
                            max_chars: int) -> tuple[str, str]:
        reader = io.BufferedReader(opened.handle, buffer_size=self._chunk_size)
        line = self._target_line(reader, pointer)
        event = json.loads(line)  # checked by _target_line: a JSON object
        text = event.get("text")
        if not isinstance(text, str):
            text = event.get("content")
        if not isinstance(text, str):
            text = line.decode("utf-8", errors="replace")
        return hashlib.sha256(line).hexdigest(), text[:max_chars]

    def _artifact_excerpt(self, opened: ContainedFile, max_chars: int) -> tuple[str, str]:
        wanted = max_chars * 4  # the most bytes max_chars characters take in UTF-8
        head = bytearray()
        hasher = hashlib.sha256()
        for chunk in self._read_chunks(opened.handle):
            hasher.update(chunk)
            if len(head) < wanted:
                head += chunk[: wanted - len(head)]
        # A character cut in two at the end of the head is left out, not replaced.
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        text = decoder.decode(bytes(head), final=opened.info.st_size <= wanted)
        return hasher.hexdigest(), text[:max_chars]

    # --- shared ---------------------------------------------------------------------------

    def _lookup(self, pointer: SourcePointer, verify: Callable[[io.FileIO], str],
                checks: FileChecks) -> str:
        """The cached outcome of the file ``pointer`` names, or ``verify`` run on it; a
        change while it was read wins over what ``verify`` said, and is not cached."""
        root, relative = self._place(pointer)
        outcome: _Cached | None = None
        if self._cache is not None:
            key = _cache_key(str(pointer), checks.contained(root, relative))
            with self._cache_lock:
                outcome = self._cache.get(key)
        if outcome is None:
            with ContainedFile(root, relative, checks) as opened:
                try:
                    fresh: _Cached = ("available", verify(opened.handle), "verified")
                except Outcome as failed:
                    fresh = (failed.status, None, failed.detail)
                opened.check_unchanged()
            if self._cache is not None:
                with self._cache_lock:
                    self._cache[_cache_key(str(pointer), opened.info)] = fresh
            outcome = fresh
        status, digest, detail = outcome
        if digest is None:
            raise Outcome(status, detail)
        return digest

    def _read_chunks(self, handle: io.FileIO) -> Iterator[memoryview]:
        """Yield the file's bytes in chunks from one reused buffer (never the whole file)."""
        buffer = bytearray(self._chunk_size)
        view = memoryview(buffer)
        while True:
            count = handle.readinto(view)
            if not count:
                return
            yield view[:count]


def _cache_key(pointer: str, info: os.stat_result) -> _CacheKey:
    return (pointer, info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns,
            info.st_ctime_ns)


#: Parsed pointers by their string (a session's pointers come back on every request).
_parsed = functools.lru_cache(maxsize=4096)(parse_source_pointer)


def checked_pointer(pointer: str, authorize: Callable[[SourcePointer], bool]
                    ) -> SourcePointer | SourceResolution:
    """``pointer`` parsed and allowed by ``authorize``, or the resolution that says why not:
    the first step of every resolver, local or remote."""
    shown = pointer if isinstance(pointer, str) else repr(pointer)
    try:
        parsed = _parsed(pointer) if isinstance(pointer, str) else parse_source_pointer(pointer)
    except UnsupportedPointerError as exc:
        return SourceResolution(shown, "unsupported", None, str(exc))
    except (ValueError, TypeError) as exc:
        return SourceResolution(shown, "denied", None, f"malformed pointer: {exc}")
    try:
        allowed = authorize(parsed) is True
    except Exception as exc:  # an authorizer bug must fail closed, not open
        return SourceResolution(shown, "denied", None, f"authorizer raised {type(exc).__name__}")
    if not allowed:
        return SourceResolution(shown, "denied", None, "not authorized for this session")
    return parsed


def checked_line(raw: bytes, expected: int, pointer: TranscriptPointer, limit: int) -> bytes:
    """Transcript line ``expected`` as read (``raw``, with its ending; empty at the end of the
    file) without its ending, once checked: present, within ``limit`` bytes, the event it
    should be."""
    if not raw:
        raise Outcome(
            "missing",
            f"transcript has {expected - 1} events, sequence {pointer.sequence} not found",
        )
    line = _strip_line_ending(raw)
    if len(line) > limit:
        raise Outcome("corrupt", f"line {expected}: longer than {limit} bytes")
    _check_event(line, expected, pointer.session_id)
    return line


def _strip_line_ending(raw: bytes) -> bytes:
    # The line ending is "\n" or "\r\n"; neither is part of the hashed evidence.
    return raw[:-1].removesuffix(b"\r") if raw.endswith(b"\n") else raw


def _check_event(line: bytes, expected: int, session_id: str) -> None:
    """One transcript line must be the JSON event number ``expected`` of ``session_id``."""
    where = f"line {expected}"
    try:
        event = json.loads(line)
    except (ValueError, RecursionError):
        raise Outcome("corrupt", f"{where}: not valid JSON") from None
    if not isinstance(event, dict):
        raise Outcome("corrupt", f"{where}: not a JSON object")
    sequence = event.get("sequence")
    if isinstance(sequence, bool) or sequence != expected or not isinstance(sequence, int):
        raise Outcome("corrupt", f"{where}: sequence is not {expected}")
    if event.get("session_id") != session_id:
        raise Outcome("corrupt", f"{where}: session_id does not match the pointer")
    event_id = event.get("event_id")
    if not isinstance(event_id, str) or not event_id:
        raise Outcome("corrupt", f"{where}: event_id missing or empty")


def _os_error_outcome(exc: OSError) -> tuple[ResolutionStatus, str]:
    """Map an OS error from a lookup to a status (no path or content in the detail)."""
    if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
        return "missing", "no such file"
    if isinstance(exc, PermissionError):
        return "denied", "the filesystem refused access"
    name = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
    return "corrupt", f"read error ({name})"


def resolve_durable_sources(
    state: DurableContextState, resolver: PointerResolver
) -> tuple[SourceResolution, ...]:
    """Resolve every distinct source pointer of ``state`` once, first-seen order: the input
    :func:`render_durable_context` expects."""
    if isinstance(resolver, SourcePointerResolver):
        return resolver.resolve_all(state.source_pointers())
    return tuple(resolver.resolve(pointer) for pointer in state.source_pointers())
