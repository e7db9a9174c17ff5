"""Source-pointer resolution against real files under tmp_path, and the access policy."""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import tracemalloc
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from compactor import _source_files
from compactor._pointers import ArtifactPointer, SourcePointer, TranscriptPointer
from compactor._resolver import SourcePointerResolver, SourceResolution, resolve_durable_sources
from compactor._state import DurableContextState
from compactor._state_items import DurableFact, PendingItem, RetrievalEvidence
from policies._source_access import SourceAccessPolicy, own_session_only

SESSION = "s1"
OTHER = "s2"
T0 = datetime(2025, 3, 1, tzinfo=UTC)


def allow_all(pointer: SourcePointer) -> bool:
    return True


def event_line(seq: int, session: str = SESSION, **extra: Any) -> bytes:
    event: dict[str, Any] = {"sequence": seq, "session_id": session, "event_id": f"e{seq}",
                             "type": "message", "text": f"event number {seq}"}
    event.update(extra)
    return json.dumps(event, sort_keys=True).encode()


def write_transcript(root: Path, session: str, lines: list[bytes], *, ending: bytes = b"\n",
                     final_newline: bool = True) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{session}.jsonl"
    body = ending.join(lines) + (ending if final_newline else b"")
    path.write_bytes(body)
    return path


def write_artifact(root: Path, session: str, name: str, data: bytes) -> tuple[Path, str]:
    folder = root / session
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    """A transcript root and an artifact root with a little content for SESSION and OTHER."""
    troot, aroot = tmp_path / "transcripts", tmp_path / "artifacts"
    write_transcript(troot, SESSION, [event_line(i) for i in range(1, 6)])
    write_transcript(troot, OTHER, [event_line(i, OTHER) for i in range(1, 3)])
    write_artifact(aroot, SESSION, "report.txt", b"quarterly numbers\n")
    write_artifact(aroot, OTHER, "secret.txt", b"other session's data\n")
    return troot, aroot


def resolver_for(roots: tuple[Path, Path],
                 authorize: Callable[[SourcePointer], bool] = allow_all,
                 **kwargs: Any) -> SourcePointerResolver:
    return SourcePointerResolver(roots[0], roots[1], authorize, **kwargs)


REPORT_SHA = hashlib.sha256(b"quarterly numbers\n").hexdigest()


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


# --- containment ----------------------------------------------------------------------


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks")
def test_artifact_symlink_out_of_root_is_denied(roots: tuple[Path, Path], tmp_path: Path) -> None:
    """A file symlink whose target lies outside the artifact root is denied."""
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"quarterly numbers\n")
    (roots[1] / SESSION / "link.txt").symlink_to(outside)
    result = resolver_for(roots).resolve(f"artifact:s1:link.txt:{REPORT_SHA}")
    assert result.status == "denied" and "symbolic link" in result.detail


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks")
def test_session_dir_symlink_out_of_root_is_denied(roots: tuple[Path, Path],
                                                   tmp_path: Path) -> None:
    """A session directory symlinked out of the artifact root is denied."""
    elsewhere = tmp_path / "elsewhere"
    write_artifact(elsewhere, "x", "report.txt", b"quarterly numbers\n")
    (roots[1] / "s5").symlink_to(elsewhere / "x", target_is_directory=True)
    assert resolver_for(roots).resolve(f"artifact:s5:report.txt:{REPORT_SHA}").status == "denied"


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks")
def test_transcript_symlink_out_of_root_is_denied(roots: tuple[Path, Path],
                                                  tmp_path: Path) -> None:
    """A transcript symlinked to a file outside the transcript root is denied."""
    outside = write_transcript(tmp_path / "outside", "s6", [event_line(1, "s6")])
    (roots[0] / "s6.jsonl").symlink_to(outside)
    assert resolver_for(roots).resolve("transcript:s6:1").status == "denied"


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks")
def test_symlink_inside_root_is_denied_too(roots: tuple[Path, Path]) -> None:
    """No link beneath the root is followed, even one that stays inside it: what a link
    names can change between any check and the open."""
    (roots[1] / SESSION / "alias.txt").symlink_to(roots[1] / SESSION / "report.txt")
    (roots[0] / "s9.jsonl").symlink_to(f"{SESSION}.jsonl")
    resolver = resolver_for(roots)
    for pointer in (f"artifact:s1:alias.txt:{REPORT_SHA}", "transcript:s9:1"):
        result = resolver.resolve(pointer)
        assert (result.status, result.evidence_sha256) == ("denied", None), pointer
        assert "symbolic link" in result.detail


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks")
def test_roots_that_are_symlinks_still_resolve(roots: tuple[Path, Path],
                                               tmp_path: Path) -> None:
    """The roots themselves may be links (the operator's setting, followed when opened):
    only what lies beneath them must not be."""
    (tmp_path / "t-link").symlink_to(roots[0], target_is_directory=True)
    (tmp_path / "a-link").symlink_to(roots[1], target_is_directory=True)
    resolver = SourcePointerResolver(tmp_path / "t-link", tmp_path / "a-link", allow_all)
    assert [r.status for r in resolver.resolve_all(
        ["transcript:s1:1", f"artifact:s1:report.txt:{REPORT_SHA}"])] == ["available"] * 2


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks")
def test_dangling_symlink_out_of_root_is_denied_not_missing(roots: tuple[Path, Path],
                                                            tmp_path: Path) -> None:
    """A link to a nonexistent file outside the root still says denied, revealing nothing."""
    (roots[1] / SESSION / "dangling.txt").symlink_to(tmp_path / "no-such-file")
    assert resolver_for(roots).resolve(f"artifact:s1:dangling.txt:{REPORT_SHA}").status == "denied"


# A pointer corpus: every entry resolves to a status, never an exception.
POINTER_CORPUS = [
    ("transcript:s1:1", "available"),
    (f"artifact:s1:report.txt:{REPORT_SHA[:12]}", "available"),
    ("transcript:../s1:1", "denied"),
    ("transcript:..:1", "denied"),
    ("transcript:s1/../s2:1", "denied"),
    ("transcript:%2e%2e:1", "denied"),
    ("transcript:s1:0", "denied"),
    ("transcript:s1:01", "denied"),
    ("transcript:s1", "denied"),
    (f"artifact:s1:../../s2/secret.txt:{REPORT_SHA}", "denied"),
    (f"artifact:s1:..%2F..%2Fetc%2Fpasswd:{REPORT_SHA}", "denied"),
    (f"artifact:s1:..%5c..%5cwin.ini:{REPORT_SHA}", "denied"),
    (f"artifact:s1:report.txt\x00.png:{REPORT_SHA}", "denied"),
    (f"artifact:s1:{'a' * 300}:{REPORT_SHA}", "denied"),
    ("transcript:" + "s" * 200 + ":1", "denied"),
    (f"artifact:s1:report.txt:{REPORT_SHA.upper()}", "denied"),
    ("artifact:s1:report.txt", "denied"),
    ("file:///etc/passwd", "unsupported"),
    ("memory:m-1", "unsupported"),
    ("", "unsupported"),
    ("transcript:s1:99", "missing"),
    (f"artifact:s1:report.txt:{'0' * 64}", "corrupt"),
]


@pytest.mark.parametrize(("pointer", "status"), POINTER_CORPUS)
def test_pointer_corpus_resolves_to_expected_status(roots: tuple[Path, Path], pointer: str,
                                                    status: str) -> None:
    """Traversal, encoded separators, NUL, overlong names and bad hashes each get a status."""
    result = resolver_for(roots).resolve(pointer)
    assert result.status == status, result.detail
    assert result.pointer == pointer
    assert (result.evidence_sha256 is not None) == (status == "available")


def test_non_string_pointer_is_denied_not_raised(roots: tuple[Path, Path]) -> None:
    """A pointer that is not even a string resolves as denied rather than raising."""
    result = resolver_for(roots).resolve(12345)  # type: ignore[arg-type]
    assert result.status == "denied"


# --- authorization --------------------------------------------------------------------

_opened: list[str] | None = None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _opened is not None and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _opened.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)


def _opens_during(action: Callable[[], object], under: Path) -> list[str]:
    global _opened
    _opened = []
    try:
        action()
        return [p for p in _opened if p.startswith(str(under))]
    finally:
        _opened = None


@pytest.mark.parametrize(
    "pointer", ["transcript:s2:1", "artifact:s2:secret.txt:" + "0" * 12])
def test_denied_authorization_opens_no_file(roots: tuple[Path, Path], tmp_path: Path,
                                           pointer: str) -> None:
    """When the authorizer refuses, the result is denied and no file under the roots is opened."""
    resolver = resolver_for(roots, own_session_only(SESSION))
    results: list[SourceResolution] = []
    opened = _opens_during(lambda: results.append(resolver.resolve(pointer)), tmp_path)
    assert results[0].status == "denied"
    assert opened == []
    # The detector works: an allowed lookup of the same kind does open the file.
    allowed = resolver_for(roots)
    assert _opens_during(lambda: allowed.resolve(pointer), tmp_path) != []


def test_denied_authorization_wins_over_nonexistent_root(tmp_path: Path) -> None:
    """Refused pointers are denied even when the roots do not exist: no lookup was made."""
    resolver = SourcePointerResolver(tmp_path / "no-t", tmp_path / "no-a", lambda p: False)
    assert resolver.resolve("transcript:s1:1").status == "denied"
    assert not (tmp_path / "no-t").exists()


def test_authorizer_receives_the_parsed_pointer(roots: tuple[Path, Path]) -> None:
    """authorize is called once with the parsed pointer object; malformed ones never reach it."""
    seen: list[SourcePointer] = []

    def authorize(pointer: SourcePointer) -> bool:
        seen.append(pointer)
        return True

    resolver = resolver_for(roots, authorize)
    resolver.resolve(f"artifact:s1:report.txt:{REPORT_SHA[:12]}")
    resolver.resolve("transcript:..:1")
    resolver.resolve("memory:m1")
    assert seen == [ArtifactPointer("s1", "report.txt", REPORT_SHA[:12])]


@pytest.mark.parametrize("answer", [1, "yes", None, [True]])
def test_only_exactly_true_authorizes(roots: tuple[Path, Path], answer: object) -> None:
    """A truthy answer that is not True fails closed as denied."""
    resolver = resolver_for(roots, lambda p: answer)  # type: ignore[arg-type,return-value]
    assert resolver.resolve("transcript:s1:1").status == "denied"


def test_authorizer_exception_fails_closed(roots: tuple[Path, Path]) -> None:
    """An authorizer that raises yields denied, naming the exception type only."""
    def broken(pointer: SourcePointer) -> bool:
        raise RuntimeError("policy backend down")

    result = resolver_for(roots, broken).resolve("transcript:s1:1")
    assert result.status == "denied" and "RuntimeError" in result.detail


def test_another_sessions_pointer_is_denied_by_default_policy(roots: tuple[Path, Path]) -> None:
    """Under own_session_only, s1 cannot resolve s2's transcript or artifact, though both exist."""
    resolver = resolver_for(roots, own_session_only(SESSION))
    other_sha = hashlib.sha256(b"other session's data\n").hexdigest()
    assert resolver.resolve("transcript:s2:1").status == "denied"
    assert resolver.resolve(f"artifact:s2:secret.txt:{other_sha}").status == "denied"
    assert resolver.resolve("transcript:s1:1").status == "available"


# --- the policy itself ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "requester", "owner", "allowed"),
    [
        (SourceAccessPolicy(), "s1", "s1", True),
        (SourceAccessPolicy(), "s1", "s2", False),
        (SourceAccessPolicy(shared_sessions=["kb"]), "s1", "kb", True),
        (SourceAccessPolicy(shared_sessions=["kb"]), "s1", "s2", False),
        (SourceAccessPolicy(allow_cross_session=True), "s1", "s2", True),
    ],
)
def test_source_access_policy_decides_by_pointer_session(
        policy: SourceAccessPolicy, requester: str, owner: str, allowed: bool) -> None:
    """Own session always, shared sessions for everyone, others only with allow_cross_session."""
    assert policy.authorizer(requester)(TranscriptPointer(owner, 1)) is allowed


@pytest.mark.parametrize("policy", [SourceAccessPolicy(),
                                    SourceAccessPolicy(allow_cross_session=True)])
def test_authorizer_refuses_objects_without_session_id(policy: SourceAccessPolicy) -> None:
    """Something that is not a pointer (no string session_id) is never authorized."""
    authorize = policy.authorizer("s1")
    assert authorize(object()) is False  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: SourceAccessPolicy(allow_cross_session="yes"),  # type: ignore[arg-type]
         "allow_cross_session"),
        (lambda: SourceAccessPolicy(shared_sessions="kb"), "shared_sessions"),
        (lambda: SourceAccessPolicy(shared_sessions=["kb", ""]), "shared_sessions[1]"),
        (lambda: SourceAccessPolicy().authorizer(""), "requesting_session_id"),
    ],
)
def test_source_access_policy_rejects_bad_settings(build: Callable[[], object],
                                                   field: str) -> None:
    """Invalid policy settings raise ValueError naming the setting."""
    with pytest.raises(ValueError) as info:
        build()
    assert str(info.value).startswith(f"{field}:")


def test_shared_sessions_list_becomes_tuple() -> None:
    """The frozen policy stores shared_sessions as a tuple."""
    assert SourceAccessPolicy(shared_sessions=["a", "b"]).shared_sessions == ("a", "b")


# --- resolve_durable_sources ----------------------------------------------------------


class _Counting(SourcePointerResolver):
    """A real resolver that also records what it was asked."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.asked: list[str] = []

    def resolve(self, pointer: str) -> SourceResolution:
        self.asked.append(pointer)
        return super().resolve(pointer)

    def resolve_all(self, pointers: Iterable[str]) -> tuple[SourceResolution, ...]:
        pointers = list(pointers)
        self.asked.extend(pointers)
        return super().resolve_all(pointers)


def test_resolve_durable_sources_resolves_each_pointer_once_in_first_seen_order(
        roots: tuple[Path, Path]) -> None:
    """Shared pointers are resolved once; results follow facts, pending items, evidence."""
    artifact = f"artifact:s1:report.txt:{REPORT_SHA[:12]}"
    state = DurableContextState(
        facts=[DurableFact("f1", "a", "transcript:s1:2", T0),
               DurableFact("f2", "b", artifact, T0),
               DurableFact("f3", "c", "transcript:s1:2", T0)],
        pending_items=[PendingItem("p1", "d", "transcript:s2:1", T0),
                       PendingItem("p2", "e", artifact, T0)],
        retrieval_evidence=[RetrievalEvidence("m1", "memory:x", "t", "x", T0, 0.5, 1),
                            RetrievalEvidence("m2", "transcript:s1:2", "t", "x", T0, 0.4, 2)],
    )
    resolver = _Counting(roots[0], roots[1], own_session_only(SESSION))
    results = resolve_durable_sources(state, resolver)
    assert resolver.asked == ["transcript:s1:2", artifact, "transcript:s2:1", "memory:x"]
    assert [(r.pointer, r.status) for r in results] == [
        ("transcript:s1:2", "available"), (artifact, "available"),
        ("transcript:s2:1", "denied"), ("memory:x", "unsupported"),
    ]


def test_resolve_durable_sources_of_empty_state_is_empty(roots: tuple[Path, Path]) -> None:
    """An empty state needs no resolution at all."""
    assert resolve_durable_sources(DurableContextState(), resolver_for(roots)) == ()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"status": "fine", "evidence_sha256": None}, "status"),
        ({"status": "available", "evidence_sha256": None}, "evidence_sha256"),
        ({"status": "available", "evidence_sha256": "ab" * 6}, "evidence_sha256"),
        ({"status": "missing", "evidence_sha256": "ab" * 32}, "evidence_sha256"),
    ],
)
def test_source_resolution_rejects_inconsistent_status_and_digest(kwargs: dict[str, Any],
                                                                  field: str) -> None:
    """A resolution cannot claim availability without a full digest, or carry one otherwise."""
    with pytest.raises(ValueError, match=f"^{field}:"):
        SourceResolution(pointer="transcript:s1:1", detail="", **kwargs)


# --- excerpts (for the operator) ------------------------------------------------------


def test_excerpt_of_a_transcript_event_is_its_text(roots: tuple[Path, Path]) -> None:
    """An available event's excerpt is its ``text``, next to the same resolution."""
    resolver = resolver_for(roots)
    excerpt = resolver.excerpt("transcript:s1:3")
    assert excerpt.resolution == resolver.resolve("transcript:s1:3")
    assert excerpt.text == "event number 3"


def test_excerpt_of_an_event_without_text_is_its_line(tmp_path: Path) -> None:
    """An event whose ``text`` is not a string shows its JSON line instead."""
    troot = tmp_path / "t"
    write_transcript(troot, SESSION, [event_line(1, text={"not": "text"})])
    excerpt = SourcePointerResolver(troot, tmp_path / "a", allow_all).excerpt("transcript:s1:1")
    assert excerpt.text == event_line(1, text={"not": "text"}).decode()


def test_excerpt_of_an_artifact_is_its_start(roots: tuple[Path, Path]) -> None:
    """An available artifact's excerpt is its first characters."""
    excerpt = resolver_for(roots).excerpt(f"artifact:s1:report.txt:{REPORT_SHA[:12]}")
    assert excerpt.resolution.status == "available"
    assert excerpt.text == "quarterly numbers\n"


@pytest.mark.parametrize("data", ["x" * 2000, "é" * 2000, "🙂" * 2000, "a" + "🙂" * 700])
def test_artifact_excerpt_is_at_most_max_chars_whole_characters(tmp_path: Path,
                                                                data: str) -> None:
    """However many bytes each character takes, the excerpt is the first 500 characters."""
    aroot = tmp_path / "a"
    _, digest = write_artifact(aroot, SESSION, "big.txt", data.encode())
    excerpt = SourcePointerResolver(tmp_path / "t", aroot, allow_all).excerpt(
        f"artifact:s1:big.txt:{digest}")
    assert excerpt.text == data[:500]


def test_transcript_excerpt_is_bounded_too(tmp_path: Path) -> None:
    """A long event text is cut at ``max_chars``."""
    troot = tmp_path / "t"
    write_transcript(troot, SESSION, [event_line(1, text="y" * 5000)])
    resolver = SourcePointerResolver(troot, tmp_path / "a", allow_all)
    assert resolver.excerpt("transcript:s1:1").text == "y" * 500
    assert resolver.excerpt("transcript:s1:1", max_chars=7).text == "y" * 7


@pytest.mark.parametrize(
    ("pointer", "status"),
    [("transcript:s1:99", "missing"), ("transcript:s2:1", "denied"),
     ("artifact:s1:report.txt:" + "0" * 12, "corrupt"), ("memory:kb-1", "unsupported"),
     ("transcript:../s2:1", "denied")],
)
def test_no_excerpt_unless_the_source_is_available(roots: tuple[Path, Path], pointer: str,
                                                   status: str) -> None:
    """Missing, denied (another session's, a traversal), corrupt and unsupported sources
    show their status and no text."""
    excerpt = resolver_for(roots, own_session_only(SESSION)).excerpt(pointer)
    assert (excerpt.resolution.status, excerpt.text) == (status, None)


def test_no_excerpt_when_the_file_changed_since_it_was_verified(
        roots: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A source whose bytes no longer have the verified digest shows no text."""
    resolver = resolver_for(roots)
    real_resolve = resolver.resolve

    def resolve_then_change(pointer: str) -> SourceResolution:
        result = real_resolve(pointer)
        write_artifact(roots[1], SESSION, "report.txt", b"quarterly numbers, revised\n")
        return result

    monkeypatch.setattr(resolver, "resolve", resolve_then_change)
    excerpt = resolver.excerpt(f"artifact:s1:report.txt:{REPORT_SHA}")
    assert excerpt.resolution.status == "available" and excerpt.text is None


def test_excerpts_are_never_rendered(roots: tuple[Path, Path]) -> None:
    """The rendered block is built from resolutions only: no excerpt text in it."""
    from compactor._render import render_durable_context

    state = DurableContextState(facts=[DurableFact("f1", "c", "transcript:s1:3",
                                                   datetime(2025, 3, 1, tzinfo=UTC))])
    resolver = resolver_for(roots)
    assert resolver.excerpt("transcript:s1:3").text == "event number 3"
    text = render_durable_context(state, resolve_durable_sources(state, resolver))
    assert "event number" not in text
