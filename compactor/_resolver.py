"""Resolve source pointers against the transcript and artifact roots: the only part of
``compactor`` that reads files.

Theory of operation. ``resolve`` never raises for a bad pointer or a bad file; it returns
one of five statuses:

- ``unsupported``: the scheme is unknown;
- ``denied``: the pointer is malformed (a traversal attempt is just a malformed pointer),
  the authorizer said no (or failed), a symlink leads out of the root, or the OS refused;
- ``missing``: no such file, a transcript too short, a file removed while being read;
- ``corrupt``: the file exists but is not what the pointer promises (wrong digest, a broken
  transcript line, a directory or device where a regular file should be, a file replaced
  while being read);
- ``available``: verified; ``evidence_sha256`` is the 64-hex digest of the evidence (the
  whole artifact, or the target transcript line without its line ending).

The order is fixed: parse, then authorize, then touch the disk. An authorizer that says no
costs no system call at all.

Containment: the target's ``os.path.realpath`` must lie inside the root's, by
``os.path.commonpath``. The file is then opened by that real path with ``O_NOFOLLOW`` (a
link swapped in after the check fails to open and is denied) and ``O_NONBLOCK`` (a FIFO
cannot hang the request), and ``fstat`` decides whether it is a regular file *before* a
byte is read. A non-regular file inside the root is ``corrupt``: it is not an escape, just
not a valid source. After reading, the path is looked up again: gone means ``missing``, a
different inode means ``corrupt`` (the bytes read are no longer what the path names).

Both kinds of file are streamed: transcripts line by line up to the target (each line
capped at ``max_line_bytes``), artifacts in ``chunk_size`` chunks into one reused buffer.

:meth:`SourcePointerResolver.excerpt` is for an operator's eyes (the admin API, the CLI): the
resolution, then, for an available source, the start of its text (the transcript event's
``text``, or the artifact's first characters), at most ``max_chars``. It resolves first (so
the same parse, authorization, strict names and containment apply), then reads the file once
more and shows the excerpt only if what it read has the digest just verified. Excerpts are
never rendered: :func:`render_durable_context` takes resolutions, which hold no text.

The proxy resolves the same pointers on every request, so outcomes read from a file are
remembered, keyed by the pointer and the file's identity and change stamps (device, inode,
size, mtime, ctime; ctime cannot be set back by ``touch``). A hit skips the read, never the
authorization, the containment check or the open. A request's pointers are resolved as one
batch (:meth:`SourcePointerResolver.resolve_all`): the real paths, the containment check, the
open and the ``fstat`` of a file are made once for all the pointers that name it (a session's
facts mostly point into its one transcript), not once per pointer; and a pointer string is
parsed once per process (parsing is a pure function of the string).

Everything in ``__all__`` gets re-exported.
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
import stat
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, get_args

from cachetools import LRUCache

from ._pointers import (
    ArtifactPointer,
    SourcePointer,
    TranscriptPointer,
    UnsupportedPointerError,
    parse_source_pointer,
)

if TYPE_CHECKING:
    from ._state import DurableContextState

__all__ = ["SourceExcerpt", "SourcePointerResolver", "SourceResolution",
           "resolve_durable_sources"]

ResolutionStatus = Literal["available", "missing", "denied", "corrupt", "unsupported"]
_STATUSES: frozenset[str] = frozenset(get_args(ResolutionStatus))
_SHA256_HEX_RE = re.compile(r"[0-9a-f]{64}", re.ASCII)

DEFAULT_CHUNK_SIZE = 1024 * 1024
DEFAULT_MAX_LINE_BYTES = 32 * 1024 * 1024
DEFAULT_CACHE_ENTRIES = 4096
#: The most characters :meth:`SourcePointerResolver.excerpt` shows by default.
DEFAULT_EXCERPT_CHARS = 500

_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) \
    | getattr(os, "O_CLOEXEC", 0)

# Linux: a path's real path as the kernel resolved it, read back from a descriptor opened
# for the path alone (O_PATH: no read access needed, nothing read).
_O_PATH: int = getattr(os, "O_PATH", 0)
_PROC_FD = "/proc/self/fd/"
_KERNEL_REALPATH = bool(_O_PATH) and os.path.isdir(_PROC_FD)


def _realpath(path: str) -> str:
    """``os.path.realpath(path)``. For a path that exists, on Linux, the kernel's own
    resolution (open with ``O_PATH``, read the descriptor's ``/proc`` link: three system
    calls) rather than Python's, which ``lstat``s each component in a loop of its own (~10 µs
    a path; a request verifies several). The same answer: both follow every link and take
    ``..`` after the link it follows. Anything else — a path that does not exist (yet), a
    component that cannot be searched, a link loop, no ``/proc`` — gets Python's."""
    if _KERNEL_REALPATH:
        try:
            fd = os.open(path, _O_PATH | os.O_CLOEXEC)
        except OSError:
            return os.path.realpath(path)
        try:
            real = os.readlink(_PROC_FD + str(fd))
        except OSError:
            real = ""
        finally:
            os.close(fd)
        # (a file removed meanwhile reads "<path> (deleted)"; a path outside this process's
        # root does not start with "/")
        if real.startswith("/") and not real.endswith(" (deleted)"):
            return real
    return os.path.realpath(path)


@dataclass(frozen=True, slots=True)
class SourceResolution:
    """What resolving one pointer found.

    Args:
        pointer: the pointer string as given.
        status: ``available``, ``missing``, ``denied``, ``corrupt`` or ``unsupported``.
        evidence_sha256: the 64-hex evidence digest when ``available``, else None.
        detail: a short human-readable reason; never file content.

    Raises:
        ValueError: an unknown status, or a digest that does not match the status.
    """

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
    """A pointer's resolution and the start of its source's text, for an operator only.

    Attributes:
        resolution: what :meth:`SourcePointerResolver.resolve` said of the pointer.
        text: at most ``max_chars`` characters of the source when it is ``available`` and
            did not change while it was read again (the transcript event's ``text``, else
            its line; the artifact's start, decoded as UTF-8 with replacement characters);
            ``None`` otherwise.
    """

    resolution: SourceResolution
    text: str | None


# (pointer, st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns) -> (status, digest, detail)
_CacheKey = tuple[str, int, int, int, int, int]
_Cached = tuple[ResolutionStatus, str | None, str]


class _Outcome(Exception):
    """Internal: ends a lookup early with a status (never escapes ``resolve``)."""

    def __init__(self, status: ResolutionStatus, detail: str) -> None:
        super().__init__(detail)
        self.status: ResolutionStatus = status
        self.detail = detail


class PointerResolver(Protocol):
    """Anything that resolves pointer strings, like :class:`SourcePointerResolver`."""

    def resolve(self, pointer: str) -> SourceResolution:
        """Resolve one pointer string; never raises for a bad pointer."""
        ...


class SourcePointerResolver:
    """Checks source pointers against the files they name.

    Args:
        transcript_root: directory holding ``<session_id>.jsonl`` transcripts.
        artifact_root: directory holding ``<session_id>/<filename>`` artifacts.
        authorize: called with the parsed pointer before any file access; only a return
            value of exactly ``True`` allows the lookup (fail closed).
        chunk_size: bytes read per chunk when hashing an artifact.
        max_line_bytes: a transcript line up to the target longer than this is corrupt.
        cache_entries: how many verified outcomes to remember (0: none). An entry is keyed
            by the pointer and the file's device, inode, size, mtime and ctime, so any
            write, rename or ``touch`` to the file misses it; a hit still costs the
            authorization and the file's containment check, open and ``fstat`` (once per
            batch, :meth:`resolve_all`), but no read. Safe to share between threads.
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
        # Made absolute without touching the disk; real paths are taken per lookup, after
        # authorization, so a root created or re-linked later is seen as it is then.
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
        """Resolve one pointer string to a :class:`SourceResolution`; never raises for a
        bad pointer or a bad file."""
        return self._resolve(pointer, _FileChecks())

    def resolve_all(self, pointers: Iterable[str]) -> tuple[SourceResolution, ...]:
        """:meth:`resolve` each pointer, as one batch: the disk checks of a file that
        several pointers name (a session's transcript) are made once for all of them, not
        once each (see :class:`_FileChecks`). Each pointer is still parsed and authorized."""
        checks = _FileChecks()
        return tuple(self._resolve(pointer, checks) for pointer in pointers)

    def _resolve(self, pointer: str, checks: _FileChecks) -> SourceResolution:
        shown = pointer if isinstance(pointer, str) else repr(pointer)
        try:
            parsed = _parsed(pointer) if isinstance(pointer, str) else parse_source_pointer(
                pointer)
        except UnsupportedPointerError as exc:
            return SourceResolution(shown, "unsupported", None, str(exc))
        except (ValueError, TypeError) as exc:
            return SourceResolution(shown, "denied", None, f"malformed pointer: {exc}")
        try:
            allowed = self._authorize(parsed) is True
        except Exception as exc:  # an authorizer bug must fail closed, not open
            return SourceResolution(
                shown, "denied", None, f"authorizer raised {type(exc).__name__}"
            )
        if not allowed:
            return SourceResolution(shown, "denied", None, "not authorized for this session")
        try:
            if isinstance(parsed, TranscriptPointer):
                digest = self._resolve_transcript(parsed, checks)
            else:
                digest = self._resolve_artifact(parsed, checks)
        except _Outcome as outcome:
            return SourceResolution(shown, outcome.status, None, outcome.detail)
        except OSError as exc:
            status, detail = _os_error_outcome(exc)
            return SourceResolution(shown, status, None, detail)
        return SourceResolution(shown, "available", digest, "verified")

    # --- transcripts ----------------------------------------------------------------------

    def _transcript_path(self, pointer: TranscriptPointer, checks: _FileChecks) -> str:
        name = pointer.session_id + ".jsonl"
        path = os.path.join(self._transcript_root, name)
        # The transcript must be that very file: a link to another session's transcript
        # (inside the root or not) is refused.
        real_root = checks.realpath(self._transcript_root)
        if (checks.realpath(path) != os.path.join(real_root, name)
                and checks.lexists(path)):
            raise _Outcome("denied", "the transcript is a link to another file")
        return path

    def _resolve_transcript(self, pointer: TranscriptPointer, checks: _FileChecks) -> str:
        def scan(handle: io.FileIO) -> str:
            # Not closed separately: closing the raw handle is enough, and it must stay
            # open for the after-read check.
            reader = io.BufferedReader(handle, buffer_size=self._chunk_size)
            return self._scan_transcript(reader, pointer)

        return self._lookup(self._transcript_root, self._transcript_path(pointer, checks),
                            str(pointer), scan, checks)

    def _scan_transcript(self, reader: io.BufferedReader[io.FileIO],
                         pointer: TranscriptPointer) -> str:
        return hashlib.sha256(self._target_line(reader, pointer)).hexdigest()

    def _target_line(self, reader: io.BufferedReader[io.FileIO],
                     pointer: TranscriptPointer) -> bytes:
        """The event line the pointer names (without its line ending), every line before it
        checked."""
        limit = self._max_line_bytes
        for expected in range(1, pointer.sequence + 1):
            raw = reader.readline(limit + 2)  # room for the line ending
            if not raw:
                raise _Outcome(
                    "missing",
                    f"transcript has {expected - 1} events, sequence {pointer.sequence} "
                    "not found",
                )
            line = _strip_line_ending(raw)
            if len(line) > limit:
                raise _Outcome("corrupt", f"line {expected}: longer than {limit} bytes")
            _check_event(line, expected, pointer.session_id)
            if expected == pointer.sequence:
                return line
        raise AssertionError("unreachable: sequence >= 1")  # pragma: no cover

    # --- artifacts ------------------------------------------------------------------------

    def _artifact_path(self, pointer: ArtifactPointer,
                       checks: _FileChecks) -> tuple[str, str]:
        """``(the session's folder, the artifact's path)``."""
        # Containment is per session: a link (symbolic or hard) into another session's
        # folder must not pass for this session's artifact.
        real_root = checks.realpath(self._artifact_root)
        session_dir = os.path.join(real_root, pointer.session_id)
        folder = os.path.join(self._artifact_root, pointer.session_id)
        if checks.realpath(folder) != session_dir and checks.lexists(folder):
            raise _Outcome("denied", "the session folder is a link")
        return session_dir, os.path.join(session_dir, pointer.filename)

    def _resolve_artifact(self, pointer: ArtifactPointer, checks: _FileChecks) -> str:
        session_dir, path = self._artifact_path(pointer, checks)

        def verify(handle: io.FileIO) -> str:
            hasher = hashlib.sha256()
            for chunk in self._read_chunks(handle):
                hasher.update(chunk)
            digest = hasher.hexdigest()
            if not digest.startswith(pointer.sha256):
                raise _Outcome("corrupt", "artifact content does not match the pointer's sha256")
            return digest

        return self._lookup(session_dir, path, str(pointer), verify, checks)

    # --- excerpts (for an operator, never for a prompt) -------------------------------------

    def excerpt(self, pointer: str, *, max_chars: int = DEFAULT_EXCERPT_CHARS) -> SourceExcerpt:
        """Resolve ``pointer``; for an available source, add the start of its text.

        Never raises for a bad pointer or a bad file: the excerpt is ``None`` unless the
        source is available and still has the digest just verified when read again.

        Raises:
            ValueError: ``max_chars`` is negative.
        """
        if max_chars < 0:
            raise ValueError(f"max_chars must be >= 0, got {max_chars}")
        resolution = self.resolve(pointer)
        if resolution.status != "available":
            return SourceExcerpt(resolution, None)
        # resolve() parsed and authorized this very pointer; the read below goes through
        # the same path checks and containment.
        parsed = parse_source_pointer(pointer)
        try:
            if isinstance(parsed, TranscriptPointer):
                digest, text = self._transcript_excerpt(parsed, max_chars)
            else:
                digest, text = self._artifact_excerpt(parsed, max_chars)
        except (_Outcome, OSError):
            return SourceExcerpt(resolution, None)
        if digest != resolution.evidence_sha256:  # changed since it was verified
            return SourceExcerpt(resolution, None)
        return SourceExcerpt(resolution, text)

    def _transcript_excerpt(self, pointer: TranscriptPointer, max_chars: int) -> tuple[str, str]:
        checks = _FileChecks()
        with _ContainedFile(self._transcript_root, self._transcript_path(pointer, checks),
                            checks) as (handle, real, before):
            reader = io.BufferedReader(handle, buffer_size=self._chunk_size)
            line = self._target_line(reader, pointer)
            _check_unchanged(real, before)
        event = json.loads(line)  # checked by _target_line: a JSON object
        text = event.get("text")
        if not isinstance(text, str):
            text = event.get("content")
        if not isinstance(text, str):
            text = line.decode("utf-8", errors="replace")
        return hashlib.sha256(line).hexdigest(), text[:max_chars]

    def _artifact_excerpt(self, pointer: ArtifactPointer, max_chars: int) -> tuple[str, str]:
        checks = _FileChecks()
        session_dir, path = self._artifact_path(pointer, checks)
        wanted = max_chars * 4  # the most bytes max_chars characters take in UTF-8
        head = bytearray()
        hasher = hashlib.sha256()
        with _ContainedFile(session_dir, path, checks) as (handle, real, before):
            for chunk in self._read_chunks(handle):
                hasher.update(chunk)
                if len(head) < wanted:
                    head += chunk[: wanted - len(head)]
            _check_unchanged(real, before)
        # A character cut in two at the end of the head is left out, not replaced.
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        text = decoder.decode(bytes(head), final=before.st_size <= wanted)
        return hasher.hexdigest(), text[:max_chars]

    # --- shared ---------------------------------------------------------------------------

    def _lookup(self, root: str, path: str, pointer: str,
                verify: Callable[[io.FileIO], str], checks: _FileChecks) -> str:
        """Check the contained file (once per batch, :meth:`_FileChecks.contained`) and reuse
        its cached outcome, or open it and run ``verify`` on it.

        A change to the file while it was being read takes precedence over what ``verify``
        concluded, and such an outcome is not cached.
        """
        if self._cache is not None:
            cached = self._cache_get(_cache_key(pointer, checks.contained(root, path)[1]))
            if cached is not None:
                status, digest, detail = cached
                if digest is None:
                    raise _Outcome(status, detail)
                return digest
        with _ContainedFile(root, path, checks) as (handle, real, before):
            key = _cache_key(pointer, before)
            try:
                digest = verify(handle)
            except _Outcome as outcome:
                _check_unchanged(real, before)
                self._cache_put(key, (outcome.status, None, outcome.detail))
                raise
            _check_unchanged(real, before)
            self._cache_put(key, ("available", digest, "verified"))
            return digest

    def _cache_get(self, key: _CacheKey) -> _Cached | None:
        if self._cache is None:
            return None
        with self._cache_lock:
            return self._cache.get(key)

    def _cache_put(self, key: _CacheKey, value: _Cached) -> None:
        if self._cache is None:
            return
        with self._cache_lock:
            self._cache[key] = value

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


#: Parsed pointers by their string (a pure function: a session's pointers come back on every
#: request). What it raises is not kept.
_parsed = functools.lru_cache(maxsize=4096)(parse_source_pointer)


class _FileChecks:
    """The disk checks of one batch of pointers (:meth:`SourcePointerResolver.resolve_all`:
    one request's state), each made once: the real path of each root and path, whether a path
    exists, and each file's containment check, open and ``fstat``
    (:class:`_ContainedFile`, the handle closed again). The pointers that name one file (a
    session's transcript) share its checks; a pointer whose outcome is cached for the file as
    it is then reads nothing, as before. A read opens the file again (:class:`_ContainedFile`).
    Local to one batch (one thread)."""

    __slots__ = ("_contained", "_exists", "_real")

    def __init__(self) -> None:
        self._real: dict[str, str] = {}
        self._exists: dict[str, bool] = {}
        self._contained: dict[tuple[str, str], tuple[str, os.stat_result] | Exception] = {}

    def realpath(self, path: str) -> str:
        """``os.path.realpath(path)``, once per batch."""
        found = self._real.get(path)
        if found is None:
            found = self._real[path] = _realpath(path)
        return found

    def lexists(self, path: str) -> bool:
        """``os.path.lexists(path)``, once per batch."""
        found = self._exists.get(path)
        if found is None:
            found = self._exists[path] = os.path.lexists(path)
        return found

    def contained(self, root: str, path: str) -> tuple[str, os.stat_result]:
        """The real path and ``fstat`` of the regular file at ``path`` inside ``root``
        (:class:`_ContainedFile`'s checks), once per batch; what they raised, again."""
        found = self._contained.get((root, path))
        if found is None:
            try:
                with _ContainedFile(root, path, self) as (_handle, real, info):
                    found = (real, info)
            except (_Outcome, OSError) as exc:
                found = exc
            self._contained[root, path] = found
        if isinstance(found, Exception):
            raise found
        return found


class _ContainedFile:
    """Context manager: the regular file at ``path``, provided its real path stays inside
    ``root``'s real path; yields ``(unbuffered handle, real path, its fstat)``. The real
    paths come from ``checks`` (made once per batch)."""

    def __init__(self, root: str, path: str, checks: _FileChecks) -> None:
        self._root = root
        self._path = path
        self._checks = checks
        self._handle: io.FileIO | None = None

    def __enter__(self) -> tuple[io.FileIO, str, os.stat_result]:
        real_root = self._checks.realpath(self._root)
        real = self._checks.realpath(self._path)
        if os.path.commonpath([real_root, real]) != real_root or real == real_root:
            raise _Outcome("denied", "path leads outside the source root")
        try:
            fd = os.open(real, _OPEN_FLAGS)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _Outcome(
                    "denied", "the path is a symlink (a loop, or swapped in after the check)"
                ) from None
            raise
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise _Outcome("corrupt", "not a regular file")
            if info.st_nlink > 1:
                # A hard link cannot be told apart from the file it shares: it may be another
                # session's or lie outside the root.
                raise _Outcome("denied", "the file has more than one hard link")
            handle = io.FileIO(fd, "rb", closefd=True)
        except BaseException:
            os.close(fd)
            raise
        self._handle = handle
        return handle, real, info

    def __exit__(self, *exc_info: object) -> None:
        if self._handle is not None:
            self._handle.close()


def _check_unchanged(real: str, before: os.stat_result) -> None:
    """After reading: the path must still name the file that was read."""
    try:
        now = os.stat(real, follow_symlinks=False)
    except FileNotFoundError:
        raise _Outcome("missing", "file was removed while being read") from None
    if (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino):
        raise _Outcome("corrupt", "file was replaced while being read")


def _strip_line_ending(raw: bytes) -> bytes:
    # The line ending is "\n" or "\r\n"; neither is part of the hashed evidence.
    if raw.endswith(b"\n"):
        raw = raw[:-1]
        if raw.endswith(b"\r"):
            raw = raw[:-1]
    return raw


def _check_event(line: bytes, expected: int, session_id: str) -> None:
    """One transcript line must be the JSON event number ``expected`` of ``session_id``."""
    where = f"line {expected}"
    try:
        event = json.loads(line)
    except (ValueError, RecursionError):
        raise _Outcome("corrupt", f"{where}: not valid JSON") from None
    if not isinstance(event, dict):
        raise _Outcome("corrupt", f"{where}: not a JSON object")
    sequence = event.get("sequence")
    if isinstance(sequence, bool) or sequence != expected or not isinstance(sequence, int):
        raise _Outcome("corrupt", f"{where}: sequence is not {expected}")
    if event.get("session_id") != session_id:
        raise _Outcome("corrupt", f"{where}: session_id does not match the pointer")
    event_id = event.get("event_id")
    if not isinstance(event_id, str) or not event_id:
        raise _Outcome("corrupt", f"{where}: event_id missing or empty")


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
    """Resolve every distinct source pointer of ``state`` once, first-seen order (facts,
    pending items, evidence): the input :func:`render_durable_context` expects. A
    :class:`SourcePointerResolver` resolves them as one batch
    (:meth:`SourcePointerResolver.resolve_all`)."""
    if isinstance(resolver, SourcePointerResolver):
        return resolver.resolve_all(state.source_pointers())
    return tuple(resolver.resolve(pointer) for pointer in state.source_pointers())
