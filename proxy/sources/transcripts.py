"""Transcripts the proxy writes itself (``sources.record_transcripts``; docs/configuration.md).

A session's messages are appended, in a worker thread after the response, as the events the
resolver verifies (``transcript:<sid>:<n>`` is message n). Only messages past the events in the
file are appended; the count is read back under an exclusive ``flock`` whenever the size is not
the one this process last wrote, so several workers share a transcript safely.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import threading
from collections.abc import Sequence
from typing import Any, Final

import structlog
from cachetools import LRUCache

from compactor import is_session_id
from proxy.sources.resolvers import tenant_root

__all__ = ["TranscriptRecorder"]

_log = structlog.get_logger("proxy.transcripts")

#: Transcripts whose size and event count this process remembers.
MAX_KNOWN: Final = 10_000
_FLAGS: Final = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC


def _event_id(session_id: str, sequence: int, line: bytes) -> str:
    return hashlib.sha256(b"%s:%d:" % (session_id.encode(), sequence) + line).hexdigest()[:32]


def _count_events(fd: int) -> int:
    with os.fdopen(os.dup(fd), "rb") as reader:
        reader.seek(0)
        return sum(1 for _ in reader)


class TranscriptRecorder:
    """Appends sessions' new messages to their transcripts under ``root`` (a local path)."""

    def __init__(self, root: str, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        # path -> (size, events); read on the event loop, written by the appending thread.
        self._known: LRUCache[str, tuple[int, int]] = LRUCache(MAX_KNOWN)
        self._known_lock = threading.Lock()
        self._full: set[str] = set()

    async def record(self, tenant: str, session_id: str,
                     messages: Sequence[dict[str, Any]]) -> None:
        """Append the messages of ``messages`` not yet in the transcript (in a thread)."""
        if not is_session_id(session_id) or not messages:
            return
        path = os.path.join(tenant_root(self.root, tenant), f"{session_id}.jsonl")
        with self._known_lock:
            known = self._known.get(path)
        if (known is not None and known[1] >= len(messages)) or path in self._full:
            return  # nothing new (a resent history), or the transcript is at its bound
        await asyncio.to_thread(self._append, path, session_id, list(messages))

    def _append(self, path: str, session_id: str, messages: list[dict[str, Any]]) -> None:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(path, _FLAGS, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            with self._known_lock:
                known = self._known.get(path)
            events = known[1] if known is not None and known[0] == size else _count_events(fd)
            lines: list[bytes] = []
            for sequence, message in enumerate(messages[events:], start=events + 1):
                # (ASCII JSON: a lone surrogate the client sent stays a valid escape.)
                body = json.dumps({"role": message.get("role"),
                                   "content": message.get("content")},
                                  separators=(",", ":")).encode()
                line = json.dumps({"sequence": sequence, "session_id": session_id,
                                   "event_id": _event_id(session_id, sequence, body)},
                                  separators=(",", ":")).encode()[:-1] + b"," + body[1:] + b"\n"
                if size + len(line) > self.max_bytes:
                    self._full.add(path)
                    _log.warning("transcript_full", session_id=session_id, events=sequence - 1)
                    break
                lines.append(line)
                size += len(line)
            data = memoryview(b"".join(lines))
            while data:
                data = data[os.write(fd, data):]
            with self._known_lock:
                self._known[path] = (size, events + len(lines))
        finally:
            os.close(fd)  # (closing releases the lock)
