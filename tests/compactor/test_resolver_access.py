"""Source-pointer resolution: containment, a pointer corpus, authorization and the access policy."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from compactor._pointers import ArtifactPointer, SourcePointer, TranscriptPointer
from compactor._resolver import SourcePointerResolver, SourceResolution
from policies._source_access import SourceAccessPolicy, own_session_only
from tests.compactor.resolver_helpers import (
    REPORT_SHA,
    SESSION,
    allow_all,
    event_line,
    resolver_for,
    write_artifact,
    write_transcript,
)

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
