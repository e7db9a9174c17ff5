"""Source-pointer resolution: resolve_durable_sources and excerpts for the operator."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from compactor._resolver import SourcePointerResolver, SourceResolution, resolve_durable_sources
from compactor._state import DurableContextState
from compactor._state_items import DurableFact, PendingItem, RetrievalEvidence
from policies._source_access import own_session_only
from tests.compactor.resolver_helpers import (
    REPORT_SHA,
    SESSION,
    T0,
    allow_all,
    event_line,
    resolver_for,
    write_artifact,
    write_transcript,
)

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
