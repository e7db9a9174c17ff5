"""Source pointers: the strict, parsed form of ``transcript:<session_id>:<sequence>`` and
``artifact:<session_id>:<filename>:<sha256, 12 or 64 hex>``.

A pointer names a file under an operator-controlled root, so every part that becomes a path
component is checked here, before anything touches the disk (the rules: docs/admin.md). The
grammar admits exactly one spelling, so a parsed pointer's ``str()`` is the string it came from.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import TypeAlias
from urllib.parse import unquote

from policies._session_ids import check_session_id

__all__ = ["TranscriptPointer", "ArtifactPointer", "SourcePointer", "UnsupportedPointerError",
           "parse_source_pointer"]

MAX_FILENAME_BYTES = 255
# 64-bit counters (the cap also keeps int() away from its digit-count limit).
MAX_SEQUENCE = 2**63 - 1

_SEQUENCE_RE = re.compile(r"[1-9][0-9]*", re.ASCII)
_SHA256_RE = re.compile(r"[0-9a-f]{12}|[0-9a-f]{64}", re.ASCII)

# Path separators of every platform, the pointer's field separator, and NUL.
_FILENAME_FORBIDDEN_CHARS = frozenset("/\\:\x00")
# Controls, invisible format characters, line/paragraph separators, lone surrogates.
_FILENAME_FORBIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})

SCHEMES = ("transcript", "artifact")


class UnsupportedPointerError(ValueError):
    """The pointer's ``scheme`` (the text before the first ``:``) is neither ``transcript``
    nor ``artifact``."""

    def __init__(self, scheme: str) -> None:
        self.scheme = scheme
        super().__init__(f"unsupported source pointer scheme {scheme!r}")


def _filename_problem(name: str) -> str | None:
    """Why ``name`` is not an acceptable filename, or None when it is."""
    if not name:
        return "is empty"
    if name in (".", ".."):
        return f"{name!r} is not a file name"
    for ch in name:
        if ch in _FILENAME_FORBIDDEN_CHARS:
            return f"contains forbidden character {ch!r}"
        if unicodedata.category(ch) in _FILENAME_FORBIDDEN_CATEGORIES:
            return f"contains control or invisible character U+{ord(ch):04X}"
    return None


def _check_filename(filename: object) -> str:
    if not isinstance(filename, str):
        raise ValueError(f"filename must be a string, got {type(filename).__name__}")
    problem = _filename_problem(filename)
    if problem is not None:
        raise ValueError(f"filename {problem}")
    if len(filename.encode("utf-8")) > MAX_FILENAME_BYTES:  # (surrogates are refused above)
        raise ValueError(f"filename is longer than {MAX_FILENAME_BYTES} bytes")
    # Refuse names whose percent-decoded form would be a traversal or carry a separator.
    if "%" in filename and (problem := _filename_problem(unquote(filename))) is not None:
        raise ValueError(f"filename, once percent-decoded, {problem}")
    return filename


@dataclass(frozen=True, slots=True)
class TranscriptPointer:
    """``transcript:<session_id>:<sequence>``: event ``sequence`` (from 1) of a session's
    transcript. A field off the grammar is a ``ValueError``."""

    session_id: str
    sequence: int

    def __post_init__(self) -> None:
        check_session_id(self.session_id)
        seq = self.sequence
        if isinstance(seq, bool) or not isinstance(seq, int):
            raise ValueError(f"sequence must be an integer, got {type(seq).__name__}")
        if not 1 <= seq <= MAX_SEQUENCE:
            raise ValueError(f"sequence must be between 1 and {MAX_SEQUENCE}, got {seq}")

    def __str__(self) -> str:
        return f"transcript:{self.session_id}:{self.sequence}"


@dataclass(frozen=True, slots=True)
class ArtifactPointer:
    """``artifact:<session_id>:<filename>:<sha256>``: a file a session produced (one path
    component under its artifact directory), pinned by its sha256 (64 lowercase hex digits,
    or a 12-digit prefix). A field off the grammar is a ``ValueError``."""

    session_id: str
    filename: str
    sha256: str

    def __post_init__(self) -> None:
        check_session_id(self.session_id)
        _check_filename(self.filename)
        if not isinstance(self.sha256, str) or not _SHA256_RE.fullmatch(self.sha256):
            raise ValueError("sha256 must be 12 or 64 lowercase hex characters")

    def __str__(self) -> str:
        return f"artifact:{self.session_id}:{self.filename}:{self.sha256}"


SourcePointer: TypeAlias = TranscriptPointer | ArtifactPointer
"""Either kind of parsed pointer; ``str()`` of one gives its canonical string."""


def parse_source_pointer(s: str) -> SourcePointer:
    """Parse a pointer string strictly.

    Raises:
        UnsupportedPointerError: an unknown scheme.
        ValueError: a known scheme, the rest malformed; the message names the problem.
        TypeError: ``s`` is not a string.
    """
    if not isinstance(s, str):
        raise TypeError(f"source pointer must be a string, got {type(s).__name__}")
    scheme, sep, rest = s.partition(":")
    if not sep or scheme not in SCHEMES:
        raise UnsupportedPointerError(scheme)
    # No field may contain ':', so a plain split gives the exact field count.
    parts = rest.split(":")
    if scheme == "transcript":
        if len(parts) != 2:
            raise ValueError(
                f"transcript pointer needs 2 fields after the scheme "
                f"(session_id, sequence), got {len(parts)}"
            )
        session_id, seq_text = parts
        check_session_id(session_id)
        if not _SEQUENCE_RE.fullmatch(seq_text) or len(seq_text) > len(str(MAX_SEQUENCE)):
            raise ValueError(
                f"sequence {seq_text!r} is not a positive decimal integer "
                "without sign or leading zeros"
            )
        return TranscriptPointer(session_id, int(seq_text))
    if len(parts) != 3:
        raise ValueError(
            f"artifact pointer needs 3 fields after the scheme "
            f"(session_id, filename, sha256), got {len(parts)}"
        )
    session_id, filename, digest = parts
    return ArtifactPointer(session_id, filename, digest)
