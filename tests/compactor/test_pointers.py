"""Source pointer parsing: the strict grammar, its canonical strings and its refusals."""

from __future__ import annotations

import pytest

from compactor._pointers import (
    ArtifactPointer,
    TranscriptPointer,
    UnsupportedPointerError,
    parse_source_pointer,
)

HEX64 = "ab" * 32
HEX12 = "0123456789ab"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("transcript:s1:1", TranscriptPointer("s1", 1)),
        ("transcript:132b2f66-ee5f-4690-8904-32d9dc4d36c3:42",
         TranscriptPointer("132b2f66-ee5f-4690-8904-32d9dc4d36c3", 42)),
        ("transcript:conv-abc_DEF.v2:9223372036854775807",
         TranscriptPointer("conv-abc_DEF.v2", 2**63 - 1)),
        (f"artifact:s1:report.txt:{HEX64}", ArtifactPointer("s1", "report.txt", HEX64)),
        (f"artifact:s1:report.txt:{HEX12}", ArtifactPointer("s1", "report.txt", HEX12)),
        (f"artifact:s1:.hidden:{HEX12}", ArtifactPointer("s1", ".hidden", HEX12)),
        (f"artifact:s1:...:{HEX12}", ArtifactPointer("s1", "...", HEX12)),
        (f"artifact:s1:naïve résumé.md:{HEX12}",
         ArtifactPointer("s1", "naïve résumé.md", HEX12)),
        (f"artifact:s1:100%.txt:{HEX12}", ArtifactPointer("s1", "100%.txt", HEX12)),
        (f"artifact:s1:{'x' * 255}:{HEX12}", ArtifactPointer("s1", "x" * 255, HEX12)),
    ],
)
def test_valid_pointer_parses_and_prints_back_canonically(text: str, expected: object) -> None:
    """A valid pointer parses to its dataclass and str() gives the same string back."""
    parsed = parse_source_pointer(text)
    assert parsed == expected
    assert str(parsed) == text


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        # transcript grammar
        ("transcript:s1", "2 fields"),
        ("transcript:s1:1:2", "2 fields"),
        ("transcript:s1:0", "positive decimal"),
        ("transcript:s1:-1", "positive decimal"),
        ("transcript:s1:+1", "positive decimal"),
        ("transcript:s1:01", "leading zeros"),
        ("transcript:s1: 1", "positive decimal"),
        ("transcript:s1:1.0", "positive decimal"),
        ("transcript:s1:١", "positive decimal"),  # Arabic-Indic digit one
        ("transcript:s1:" + "9" * 5000, "positive decimal"),
        ("transcript:s1:9223372036854775808", "sequence must be between"),
        ("transcript::1", "session_id: is empty"),
        # session id traversal and odd characters
        ("transcript:.:1", "session_id"),
        ("transcript:..:1", "session_id"),
        ("transcript:.hidden:1", "session_id"),
        ("transcript:a..b:1", "session_id"),
        ("transcript:trailing.:1", "session_id"),
        ("transcript:a/b:1", "session_id"),
        ("transcript:a\\b:1", "session_id"),
        ("transcript:..%2F..%2Fetc:1", "session_id"),
        ("transcript:a\x00b:1", "session_id"),
        ("transcript:a b:1", "session_id"),
        ("transcript:" + "a" * 129 + ":1", "more than 128"),
        # artifact grammar
        (f"artifact:s1:{HEX12}", "3 fields"),
        (f"artifact:s1:a:b:{HEX12}", "3 fields"),
        ("artifact:s1:f.txt:ABCDEF012345", "lowercase hex"),
        ("artifact:s1:f.txt:0123456789a", "12 or 64"),
        ("artifact:s1:f.txt:" + "a" * 63, "12 or 64"),
        ("artifact:s1:f.txt:" + "g" * 12, "hex"),
        (f"artifact:..:f.txt:{HEX12}", "session_id"),
        (f"artifact:s1/../s2:f.txt:{HEX12}", "session_id"),
        # filename traversal, separators, encodings, controls, size
        (f"artifact:s1:.:{HEX12}", "not a file name"),
        (f"artifact:s1:..:{HEX12}", "not a file name"),
        (f"artifact:s1:../etc/passwd:{HEX12}", "forbidden character '/'"),
        (f"artifact:s1:/etc/passwd:{HEX12}", "forbidden character '/'"),
        (f"artifact:s1:..\\win.ini:{HEX12}", "forbidden character '\\\\'"),
        (f"artifact:s1:a\x00b:{HEX12}", "forbidden character '\\x00'"),
        (f"artifact:s1:a\nb:{HEX12}", "U+000A"),
        (f"artifact:s1:a\x7fb:{HEX12}", "U+007F"),
        (f"artifact:s1:evil\u202etxt.exe:{HEX12}", "U+202E"),
        (f"artifact:s1:a\u2028b:{HEX12}", "U+2028"),
        (f"artifact:s1:..%2Fetc%2Fpasswd:{HEX12}", "percent-decoded"),
        (f"artifact:s1:..%2fetc:{HEX12}", "percent-decoded"),
        (f"artifact:s1:%2e%2e:{HEX12}", "percent-decoded"),
        (f"artifact:s1:a%5Cb:{HEX12}", "percent-decoded"),
        (f"artifact:s1:a%00b:{HEX12}", "percent-decoded"),
        (f"artifact:s1:a%3Ab:{HEX12}", "percent-decoded"),
        (f"artifact:s1::{HEX12}", "filename is empty"),
        (f"artifact:s1:{'x' * 256}:{HEX12}", "longer than 255 bytes"),
        (f"artifact:s1:{'é' * 128}:{HEX12}", "longer than 255 bytes"),  # 256 bytes
    ],
)
def test_malformed_known_scheme_raises_value_error_naming_problem(text: str, problem: str) -> None:
    """A known scheme with a malformed body raises a plain ValueError that says what is wrong."""
    with pytest.raises(ValueError, match=None) as info:
        parse_source_pointer(text)
    assert not isinstance(info.value, UnsupportedPointerError)
    assert problem in str(info.value)


@pytest.mark.parametrize(
    ("text", "scheme"),
    [
        ("file:/etc/passwd", "file"),
        ("http://example.com/x", "http"),
        ("Transcript:s1:1", "Transcript"),
        ("memory:m1", "memory"),
        ("no-colon-at-all", "no-colon-at-all"),
        ("", ""),
        (":s1:1", ""),
    ],
)
def test_unknown_scheme_raises_unsupported_pointer_error(text: str, scheme: str) -> None:
    """Any scheme other than transcript/artifact raises UnsupportedPointerError with the scheme."""
    with pytest.raises(UnsupportedPointerError) as info:
        parse_source_pointer(text)
    assert info.value.scheme == scheme
    assert isinstance(info.value, ValueError)


def test_non_string_pointer_raises_type_error() -> None:
    """Parsing something that is not a string raises TypeError, not a silent result."""
    with pytest.raises(TypeError, match="must be a string"):
        parse_source_pointer(b"transcript:s1:1")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("build", "problem"),
    [
        (lambda: TranscriptPointer("..", 1), "session_id"),
        (lambda: TranscriptPointer("s1", 0), "sequence must be between"),
        (lambda: TranscriptPointer("s1", True), "must be an integer"),
        (lambda: TranscriptPointer("s1", "1"), "must be an integer"),  # type: ignore[arg-type]
        (lambda: ArtifactPointer("s1", "../x", HEX12), "forbidden character"),
        (lambda: ArtifactPointer("s1", "x", HEX12.upper()), "lowercase hex"),
    ],
)
def test_direct_construction_applies_the_same_checks(build: object, problem: str) -> None:
    """Building a pointer dataclass directly enforces the grammar parsing enforces."""
    with pytest.raises(ValueError, match=problem):
        build()  # type: ignore[operator]


def test_pointers_are_frozen_and_hashable() -> None:
    """Parsed pointers cannot be changed and can be used as dict keys."""
    pointer = TranscriptPointer("s1", 3)
    with pytest.raises(AttributeError):
        pointer.sequence = 4  # type: ignore[misc]
    table: dict[object, int] = {pointer: 1}
    assert table[parse_source_pointer("transcript:s1:3")] == 1
