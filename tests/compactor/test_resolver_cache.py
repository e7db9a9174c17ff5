"""Source-pointer resolution against real files: the outcome cache and batches."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compactor import _source_files
from compactor._pointers import TranscriptPointer
from compactor._resolver import SourcePointerResolver
from tests.compactor.resolver_helpers import (
    OTHER,
    REPORT_SHA,
    SESSION,
    allow_all,
    event_line,
    resolver_for,
    write_transcript,
)

# --- the outcome cache ---------------------------------------------------------------


class _CountingReads(SourcePointerResolver):
    """A real resolver that counts how often it actually reads a file's content."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reads = 0

    def _read_chunks(self, handle: io.FileIO) -> Iterator[memoryview]:
        self.reads += 1
        return super()._read_chunks(handle)

    def _scan_transcript(self, reader: io.BufferedReader[io.FileIO],
                         pointer: TranscriptPointer) -> str:
        self.reads += 1
        return super()._scan_transcript(reader, pointer)


def test_unchanged_file_is_not_read_again(roots: tuple[Path, Path]) -> None:
    """A second resolution of an unchanged source gives the same result without reading it."""
    resolver = _CountingReads(roots[0], roots[1], allow_all)
    pointers = [f"artifact:s1:report.txt:{REPORT_SHA}", "transcript:s1:4", "transcript:s1:99"]
    first = [resolver.resolve(p) for p in pointers]
    second = [resolver.resolve(p) for p in pointers]
    assert first == second
    assert [r.status for r in first] == ["available", "available", "missing"]
    assert resolver.reads == 3


_MIXED = ("transcript:s1:1", "transcript:s1:4", "transcript:s1:99", "transcript:s2:1",
          f"artifact:s1:report.txt:{REPORT_SHA}", f"artifact:s1:report.txt:{'0' * 64}",
          "artifact:s1:absent.txt:" + "0" * 12, "transcript:../s1:1", "memory:x")


def test_a_batch_resolves_as_each_pointer_alone(roots: tuple[Path, Path]) -> None:
    """resolve_all gives what resolve gives pointer by pointer: statuses, digests, details,
    cold and warm."""
    alone = [resolver_for(roots).resolve(p) for p in _MIXED]
    batched = resolver_for(roots)
    assert list(batched.resolve_all(_MIXED)) == alone
    assert list(batched.resolve_all(_MIXED)) == alone  # (from the cache)
    assert {r.status for r in alone} == {"available", "missing", "denied", "corrupt",
                                          "unsupported"}


def test_a_batch_checks_each_file_once(roots: tuple[Path, Path],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Warm, the pointers that name one file share its open: one open per file per batch,
    however many pointers name it; nothing is read."""
    resolver = _CountingReads(roots[0], roots[1], allow_all)
    pointers = [f"transcript:s1:{n}" for n in range(1, 6)] + [
        f"artifact:s1:report.txt:{REPORT_SHA}"]
    first = resolver.resolve_all(pointers)
    opened: list[tuple[str, int]] = []
    real_open = _source_files.open_beneath

    def counting_open(dir_fd: int, relative: str, flags: int = _source_files.FILE_FLAGS,
                      **kwargs: Any) -> int:
        opened.append((relative, flags))
        return real_open(dir_fd, relative, flags, **kwargs)

    monkeypatch.setattr(_source_files, "open_beneath", counting_open)
    assert resolver.resolve_all(pointers) == first
    assert sorted(opened) == [("s1.jsonl", _source_files.FILE_FLAGS),
                              ("s1/report.txt", _source_files.FILE_FLAGS)]
    assert resolver.reads == len(pointers)  # the first batch's, one per pointer


def test_a_batch_sees_a_change_made_before_it(roots: tuple[Path, Path]) -> None:
    """The checks are per batch: a transcript rewritten between two batches is read again."""
    resolver = resolver_for(roots)
    pointers = ["transcript:s1:2", "transcript:s1:4"]
    assert [r.status for r in resolver.resolve_all(pointers)] == ["available", "available"]
    write_transcript(roots[0], SESSION, [event_line(1), b"not json", event_line(3)])
    assert [r.status for r in resolver.resolve_all(pointers)] == ["corrupt", "corrupt"]


def test_a_transcript_swapped_for_a_link_is_denied_for_every_pointer_of_the_batch(
        roots: tuple[Path, Path]) -> None:
    resolver = resolver_for(roots)
    pointers = ["transcript:s1:1", "transcript:s1:2"]
    assert [r.status for r in resolver.resolve_all(pointers)] == ["available", "available"]
    path = roots[0] / f"{SESSION}.jsonl"
    path.unlink()
    path.symlink_to(roots[0] / f"{OTHER}.jsonl")
    assert [r.status for r in resolver.resolve_all(pointers)] == ["denied", "denied"]


def test_cache_disabled_reads_every_time(roots: tuple[Path, Path]) -> None:
    """With cache_entries=0 every resolution reads the file."""
    resolver = _CountingReads(roots[0], roots[1], allow_all, cache_entries=0)
    resolver.resolve("transcript:s1:2")
    resolver.resolve("transcript:s1:2")
    assert resolver.reads == 2


def test_rewrite_with_same_size_and_restored_mtime_is_seen(roots: tuple[Path, Path]) -> None:
    """Rewriting a file in place and touching its mtime back still misses the cache (ctime)."""
    path = roots[1] / SESSION / "report.txt"
    resolver = _CountingReads(roots[0], roots[1], allow_all)
    pointer = f"artifact:s1:report.txt:{REPORT_SHA}"
    assert resolver.resolve(pointer).status == "available"
    original = os.stat(path)
    with open(path, "r+b") as f:
        f.write(b"Q")  # same size, different content
    os.utime(path, ns=(original.st_atime_ns, original.st_mtime_ns))
    assert resolver.resolve(pointer).status == "corrupt"
    assert resolver.reads == 2


def test_appended_transcript_is_rescanned(roots: tuple[Path, Path]) -> None:
    """A sequence missing earlier becomes available once the transcript grows to it."""
    resolver = resolver_for(roots)
    assert resolver.resolve("transcript:s1:6").status == "missing"
    with open(roots[0] / f"{SESSION}.jsonl", "ab") as f:
        f.write(event_line(6) + b"\n")
    assert resolver.resolve("transcript:s1:6").status == "available"


def test_cached_source_is_still_authorized_each_time(roots: tuple[Path, Path]) -> None:
    """A cached outcome is never returned to a caller the authorizer now refuses."""
    allowed = [True]
    resolver = resolver_for(roots, lambda p: allowed[0])
    assert resolver.resolve("transcript:s1:1").status == "available"
    allowed[0] = False
    assert resolver.resolve("transcript:s1:1").status == "denied"
