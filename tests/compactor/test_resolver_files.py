"""Source-pointer resolution against real files: transcript lines and artifacts."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from compactor._resolver import SourcePointerResolver, SourceResolution
from tests.compactor.resolver_helpers import (
    OTHER,
    REPORT_SHA,
    SESSION,
    allow_all,
    event_line,
    resolver_for,
    write_transcript,
)

# --- transcripts ----------------------------------------------------------------------


def test_transcript_event_is_available_with_sha256_of_its_line(roots: tuple[Path, Path]) -> None:
    """An existing event resolves as available, its digest being that of the line's bytes."""
    result = resolver_for(roots).resolve("transcript:s1:3")
    assert result == SourceResolution(
        "transcript:s1:3", "available", hashlib.sha256(event_line(3)).hexdigest(), "verified")


@pytest.mark.parametrize("ending", [b"\n", b"\r\n"])
@pytest.mark.parametrize("final_newline", [True, False])
def test_line_ending_is_not_part_of_the_evidence(tmp_path: Path, ending: bytes,
                                                 final_newline: bool) -> None:
    """LF or CRLF endings, and a missing final newline, leave the last line's digest unchanged."""
    troot = tmp_path / "t"
    write_transcript(troot, SESSION, [event_line(1), event_line(2)], ending=ending,
                     final_newline=final_newline)
    result = SourcePointerResolver(troot, tmp_path / "a", allow_all).resolve("transcript:s1:2")
    assert result.evidence_sha256 == hashlib.sha256(event_line(2)).hexdigest()


@pytest.mark.parametrize(
    ("lines", "detail"),
    [
        ([event_line(1), b"not json", event_line(3)], "line 2: not valid JSON"),
        ([event_line(1), b"", event_line(3)], "line 2: not valid JSON"),
        ([event_line(1), b"[1, 2, 3]", event_line(3)], "line 2: not a JSON object"),
        ([event_line(1), b"\xff\xfe{}", event_line(3)], "line 2: not valid JSON"),
        ([event_line(1), b"[" * 100_000 + b"]" * 100_000, event_line(3)], "line 2: not valid"),
        ([event_line(1), event_line(2, OTHER), event_line(3)], "line 2: session_id"),
        ([event_line(1), event_line(3), event_line(3)], "line 2: sequence is not 2"),
        ([event_line(2), event_line(2), event_line(3)], "line 1: sequence is not 1"),
        ([event_line(1), event_line(2, sequence=True), event_line(3)], "line 2: sequence"),
        ([event_line(1), event_line(2, sequence="2"), event_line(3)], "line 2: sequence"),
        ([event_line(1), event_line(2, event_id=""), event_line(3)], "line 2: event_id"),
        ([event_line(1), event_line(2, event_id=None), event_line(3)], "line 2: event_id"),
        ([event_line(1), json.dumps({"sequence": 2, "session_id": SESSION}).encode(),
          event_line(3)], "line 2: event_id"),
    ],
)
def test_broken_line_up_to_target_is_corrupt(tmp_path: Path, lines: list[bytes],
                                             detail: str) -> None:
    """Any line before or at the target that is not the expected event makes it corrupt."""
    troot = tmp_path / "t"
    write_transcript(troot, SESSION, lines)
    result = SourcePointerResolver(troot, tmp_path / "a", allow_all).resolve("transcript:s1:3")
    assert (result.status, result.evidence_sha256) == ("corrupt", None)
    assert result.detail.startswith(detail), result.detail


def test_lines_after_the_target_are_not_read(tmp_path: Path) -> None:
    """Garbage after the target event does not affect the target's resolution."""
    troot = tmp_path / "t"
    write_transcript(troot, SESSION, [event_line(1), event_line(2), b"garbage"])
    result = SourcePointerResolver(troot, tmp_path / "a", allow_all).resolve("transcript:s1:2")
    assert result.status == "available"


def test_overlong_line_is_corrupt_without_being_read_whole(tmp_path: Path) -> None:
    """A line longer than max_line_bytes before the target is corrupt."""
    troot = tmp_path / "t"
    write_transcript(troot, SESSION, [event_line(1, pad="x" * 5000), event_line(2)])
    resolver = SourcePointerResolver(troot, tmp_path / "a", allow_all, max_line_bytes=1000)
    result = resolver.resolve("transcript:s1:2")
    assert result.status == "corrupt" and "longer than 1000 bytes" in result.detail


@pytest.mark.parametrize("pointer", ["transcript:s1:6", "transcript:s1:9223372036854775807"])
def test_transcript_too_short_is_missing(roots: tuple[Path, Path], pointer: str) -> None:
    """A sequence beyond the last event is missing."""
    result = resolver_for(roots).resolve(pointer)
    assert result.status == "missing" and "has 5 events" in result.detail


def test_absent_transcript_file_is_missing(roots: tuple[Path, Path]) -> None:
    """A session without a transcript file resolves as missing."""
    assert resolver_for(roots).resolve("transcript:nobody:1").status == "missing"


# --- artifacts ------------------------------------------------------------------------


@pytest.mark.parametrize("prefix_len", [12, 64])
def test_artifact_with_matching_hash_is_available_with_full_digest(
        roots: tuple[Path, Path], prefix_len: int) -> None:
    """A 12-hex prefix or the full digest both verify; the result carries all 64 hex."""
    pointer = f"artifact:s1:report.txt:{REPORT_SHA[:prefix_len]}"
    result = resolver_for(roots).resolve(pointer)
    assert (result.status, result.evidence_sha256) == ("available", REPORT_SHA)


def test_artifact_with_wrong_hash_is_corrupt(roots: tuple[Path, Path]) -> None:
    """A digest that does not start with the pointer's hex makes the artifact corrupt."""
    wrong = "0" * 64 if not REPORT_SHA.startswith("0") else "1" * 64
    result = resolver_for(roots).resolve(f"artifact:s1:report.txt:{wrong[:12]}")
    assert (result.status, result.evidence_sha256) == ("corrupt", None)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda p: p.write_bytes(b"quarterly numbers, revised\n"), id="swapped"),
        pytest.param(lambda p: p.write_bytes(b"quarterly"), id="truncated"),
        pytest.param(lambda p: p.write_bytes(b""), id="emptied"),
        pytest.param(lambda p: p.write_bytes(b"quarterly numbers\n\n"), id="appended"),
    ],
)
def test_artifact_changed_after_pointer_was_written_is_corrupt(
        roots: tuple[Path, Path], change: Callable[[Path], object]) -> None:
    """Swapping, truncating or extending the file breaks the pinned hash: corrupt."""
    change(roots[1] / SESSION / "report.txt")
    assert resolver_for(roots).resolve(f"artifact:s1:report.txt:{REPORT_SHA}").status == "corrupt"


def test_absent_artifact_is_missing(roots: tuple[Path, Path]) -> None:
    """A file that does not exist, or a session dir that does not, resolves as missing."""
    resolver = resolver_for(roots)
    assert resolver.resolve(f"artifact:s1:nope.txt:{REPORT_SHA}").status == "missing"
    assert resolver.resolve(f"artifact:s9:report.txt:{REPORT_SHA}").status == "missing"


def test_session_dir_that_is_a_file_is_missing(roots: tuple[Path, Path]) -> None:
    """When <artifact_root>/<session> is a plain file, its 'children' are missing."""
    (roots[1] / "s3").write_bytes(b"x")
    assert resolver_for(roots).resolve(f"artifact:s3:report.txt:{REPORT_SHA}").status == "missing"


def test_directory_in_place_of_file_is_corrupt(roots: tuple[Path, Path]) -> None:
    """A directory where the artifact should be is not a regular file: corrupt."""
    (roots[1] / SESSION / "dir.txt").mkdir()
    result = resolver_for(roots).resolve(f"artifact:s1:dir.txt:{REPORT_SHA}")
    assert result.status == "corrupt" and "not a regular file" in result.detail


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_in_place_of_transcript_is_corrupt_without_blocking(roots: tuple[Path, Path]) -> None:
    """A FIFO at the transcript path is refused as corrupt instead of hanging on open/read."""
    os.mkfifo(roots[0] / "fifo.jsonl")
    assert resolver_for(roots).resolve("transcript:fifo:1").status == "corrupt"


class _DuringRead(SourcePointerResolver):
    """Runs ``action`` after the first chunk is hashed: a real file change mid-read."""

    def __init__(self, *args: Any, action: Callable[[], object], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._action = action

    def _read_chunks(self, handle: io.FileIO) -> Iterator[memoryview]:
        for index, chunk in enumerate(super()._read_chunks(handle)):
            yield chunk
            if index == 0:
                self._action()


def test_artifact_removed_while_being_read_is_missing(roots: tuple[Path, Path]) -> None:
    """Deleting the file after hashing has begun yields missing, not the stale digest."""
    path = roots[1] / SESSION / "report.txt"
    resolver = _DuringRead(roots[0], roots[1], allow_all, chunk_size=4, action=path.unlink)
    result = resolver.resolve(f"artifact:s1:report.txt:{REPORT_SHA}")
    assert result.status == "missing" and "removed while being read" in result.detail


def test_artifact_replaced_while_being_read_is_corrupt(roots: tuple[Path, Path]) -> None:
    """Renaming another file over the path mid-read yields corrupt, even if the bytes match."""
    path = roots[1] / SESSION / "report.txt"
    twin = roots[1] / SESSION / "twin.txt"
    twin.write_bytes(path.read_bytes())
    resolver = _DuringRead(roots[0], roots[1], allow_all, chunk_size=4,
                           action=lambda: os.replace(twin, path))
    result = resolver.resolve(f"artifact:s1:report.txt:{REPORT_SHA}")
    assert result.status == "corrupt" and "replaced while being read" in result.detail


def test_large_sparse_artifact_is_hashed_in_small_memory(tmp_path: Path) -> None:
    """A 50 MB artifact is hashed by streaming: Python's peak allocation stays a few MB."""
    size = 50 * 1024 * 1024
    folder = tmp_path / "a" / SESSION
    folder.mkdir(parents=True)
    with open(folder / "big.bin", "wb") as f:
        f.truncate(size)
    expected = hashlib.sha256()
    zeros = bytes(1024 * 1024)
    for _ in range(size // len(zeros)):
        expected.update(zeros)
    del zeros
    resolver = SourcePointerResolver(tmp_path / "t", tmp_path / "a", allow_all)
    tracemalloc.start()
    try:
        result = resolver.resolve(f"artifact:s1:big.bin:{expected.hexdigest()}")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (result.status, result.evidence_sha256) == ("available", expected.hexdigest())
    assert peak < 4 * 1024 * 1024, f"peak {peak} bytes"
