"""Durable state types: construction checks, pointer listing, emptiness, evidence capture."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from compactor._state import DurableContextState, capture_retrieval_evidence
from compactor._state_items import DurableFact, PendingItem, RetrievalEvidence
from tests.compactor.state_items import NAIVE, T0, evidence, fact, item

# --- construction ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: DurableFact("", "c", "transcript:s1:1", T0), "fact_id"),
        (lambda: DurableFact("  \t", "c", "transcript:s1:1", T0), "fact_id"),
        (lambda: DurableFact(7, "c", "transcript:s1:1", T0), "fact_id"),  # type: ignore[arg-type]
        (lambda: DurableFact("f", "", "transcript:s1:1", T0), "content"),
        (lambda: DurableFact("f", " \n", "transcript:s1:1", T0), "content"),
        (lambda: DurableFact("f", "c", "", T0), "source_pointer"),
        (lambda: DurableFact("f", "c", "   ", T0), "source_pointer"),
        (lambda: DurableFact("f", "c", "transcript:s1:1", NAIVE), "last_confirmed_at"),
        (lambda: DurableFact("f", "c", "transcript:s1:1", "2025-03-01T12:00:00"),
         "last_confirmed_at"),
        (lambda: DurableFact("f", "c", "transcript:s1:1", 1700000000),  # type: ignore[arg-type]
         "last_confirmed_at"),
        (lambda: PendingItem("", "d", "transcript:s1:1", T0), "item_id"),
        (lambda: PendingItem("p", "", "transcript:s1:1", T0), "description"),
        (lambda: PendingItem("p", "d", "", T0), "source_pointer"),
        (lambda: PendingItem("p", "d", "transcript:s1:1", NAIVE), "last_confirmed_at"),
        (lambda: PendingItem("p", "d", "transcript:s1:1", T0, status="finished"), "status"),
        (lambda: PendingItem("p", "d", "transcript:s1:1", T0, status="Open"), "status"),
        (lambda: PendingItem("p", "d", "transcript:s1:1", T0, status=None),  # type: ignore[arg-type]
         "status"),
        (lambda: evidence(memory_id=""), "memory_id"),
        (lambda: evidence(source_id=" "), "source_id"),
        (lambda: evidence(source_type=None), "source_type"),
        (lambda: evidence(source_title=3), "source_title"),
        (lambda: evidence(captured_at=NAIVE), "captured_at"),
        (lambda: evidence(conflict_key=""), "conflict_key"),
    ],
)
def test_construction_rejects_invalid_field_naming_it(build: Any, field: str) -> None:
    """An empty id, source or text, or a naive timestamp raises ValueError naming the field."""
    with pytest.raises(ValueError) as info:
        build()
    assert str(info.value).startswith(f"{field}:")


@pytest.mark.parametrize("score", [-0.001, 1.0001, math.nan, math.inf, -math.inf, True, False,
                                   "0.5", None])
def test_score_outside_unit_interval_or_not_a_number_is_rejected(score: object) -> None:
    """Scores must be real numbers in [0, 1]: NaN, infinities, bools and strings fail."""
    with pytest.raises(ValueError, match="^score:"):
        evidence(score=score)


@pytest.mark.parametrize("score", [0, 1, 0.0, 1.0, 0.123456])
def test_score_inside_unit_interval_is_kept_as_float(score: float) -> None:
    """Scores 0..1 (ints included) are accepted and stored as floats."""
    ev = evidence(score=score)
    assert ev.score == score and isinstance(ev.score, float)


@pytest.mark.parametrize("rank", [0, -1, 1.0, True, "1", None])
def test_rank_below_one_or_not_an_int_is_rejected(rank: object) -> None:
    """source_rank must be an int >= 1 (bools and floats are not ints here)."""
    with pytest.raises(ValueError, match="^source_rank:"):
        evidence(source_rank=rank)


def test_timestamp_without_utc_equivalent_is_rejected() -> None:
    """A year-1 time east of UTC cannot be rendered in UTC, so it is refused up front."""
    early = datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5)))
    with pytest.raises(ValueError, match="^last_confirmed_at: .*out of range"):
        DurableFact("f", "c", "transcript:s1:1", early)


def test_state_turns_lists_into_tuples() -> None:
    """Lists given to DurableContextState are stored as tuples."""
    state = DurableContextState(facts=[fact()], pending_items=[item()],
                                retrieval_evidence=[evidence()])
    assert isinstance(state.facts, tuple)
    assert isinstance(state.pending_items, tuple)
    assert isinstance(state.retrieval_evidence, tuple)
    hash(state)  # frozen all the way down


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"facts": [fact("a"), fact("b"), fact("a")]}, "facts[2].fact_id: duplicate id 'a'"),
        ({"pending_items": [item("x"), item("x")]}, "pending_items[1].item_id: duplicate id"),
        ({"retrieval_evidence": [evidence("m"), evidence("m")]},
         "retrieval_evidence[1].memory_id: duplicate id"),
        ({"facts": [item()]}, "facts[0]: must be a DurableFact"),
        ({"facts": "f1"}, "facts: must be a list or tuple"),
        ({"facts": {"fact_id": "f1"}}, "facts: must be a list or tuple"),
    ],
)
def test_state_rejects_duplicates_and_wrong_items(kwargs: dict[str, Any], message: str) -> None:
    """Duplicate ids within a kind, wrong item types and non-lists raise with the field path."""
    with pytest.raises(ValueError) as info:
        DurableContextState(**kwargs)
    assert str(info.value).startswith(message)


def test_same_id_in_different_kinds_is_allowed() -> None:
    """Ids only need to be unique within their own kind."""
    state = DurableContextState(facts=[fact("x")], pending_items=[item("x")],
                                retrieval_evidence=[evidence("x")])
    assert len(state.facts) == len(state.pending_items) == len(state.retrieval_evidence) == 1


def test_items_are_frozen() -> None:
    """Durable items cannot be changed after construction."""
    with pytest.raises(AttributeError):
        fact().content = "changed"  # type: ignore[misc]


# --- pointers and emptiness -----------------------------------------------------------


def test_source_pointers_are_distinct_in_first_seen_order() -> None:
    """source_pointers lists facts, then pending items, then evidence, each pointer once."""
    state = DurableContextState(
        facts=[fact("f1", "transcript:s1:5"), fact("f2", "transcript:s1:1"),
               fact("f3", "transcript:s1:5")],
        pending_items=[item("p1", "transcript:s1:1"), item("p2", "artifact:s1:a:0123456789ab")],
        retrieval_evidence=[evidence("m1", "memory:zz"), evidence("m2", "transcript:s1:5")],
    )
    assert state.source_pointers() == (
        "transcript:s1:5", "transcript:s1:1", "artifact:s1:a:0123456789ab", "memory:zz",
    )


@pytest.mark.parametrize(
    ("state", "empty"),
    [
        (DurableContextState(), True),
        (DurableContextState(facts=[fact()]), False),
        (DurableContextState(pending_items=[item()]), False),
        (DurableContextState(retrieval_evidence=[evidence()]), False),
    ],
)
def test_is_empty_is_true_only_without_items(state: DurableContextState, empty: bool) -> None:
    """is_empty is True exactly when no kind holds an item."""
    assert state.is_empty is empty


# --- capture --------------------------------------------------------------------------


@dataclass
class Hit:
    memory_id: str
    source_id: str
    source_type: str
    source_title: str
    score: float
    rank: int
    text: str
    conflict_key: str | None = None


def test_capture_copies_provenance_from_objects_and_mappings_in_order() -> None:
    """Hits given as objects or mappings become evidence in the order given, ranks as given."""
    hits: list[object] = [
        Hit("m2", "transcript:s1:9", "transcript", "later talk", 0.4, 2, "text", "region"),
        {"memory_id": "m1", "source_id": "artifact:s1:a.md:0123456789ab", "source_type": "doc",
         "source_title": "spec", "score": 0.9, "source_rank": 1},
    ]
    captured = capture_retrieval_evidence(hits, now=T0)
    assert captured == (
        RetrievalEvidence("m2", "transcript:s1:9", "transcript", "later talk", T0, 0.4, 2,
                          "region"),
        RetrievalEvidence("m1", "artifact:s1:a.md:0123456789ab", "doc", "spec", T0, 0.9, 1),
    )


def test_capture_never_copies_recalled_text() -> None:
    """text, content and excerpt on a hit are ignored: no field of the evidence holds them."""
    secret = "RECALLED-SECRET-TEXT"
    hit = {"memory_id": "m1", "source_id": "transcript:s1:1", "source_type": "t",
           "source_title": "title", "score": 0.5, "rank": 1,
           "text": secret, "content": secret, "excerpt": secret}
    (captured,) = capture_retrieval_evidence([hit], now=T0)
    assert secret not in json.dumps(DurableContextState(retrieval_evidence=[captured]).to_dict())


def test_capture_uses_hit_captured_at_when_present() -> None:
    """A hit's own captured_at (datetime or ISO string) wins over the default time."""
    base = {"source_id": "transcript:s1:1", "source_type": "t", "source_title": "x",
            "score": 0.5, "rank": 1}
    earlier = T0 - timedelta(days=1)
    captured = capture_retrieval_evidence(
        [{**base, "memory_id": "a", "captured_at": earlier},
         {**base, "memory_id": "b", "captured_at": "2025-02-01T00:00:00Z"}], now=T0)
    assert captured[0].captured_at == earlier
    assert captured[1].captured_at == datetime(2025, 2, 1, tzinfo=UTC)


def test_capture_defaults_captured_at_to_now_in_utc() -> None:
    """Without captured_at or now=, the capture time is the current time in UTC."""
    before = datetime.now(UTC)
    (captured,) = capture_retrieval_evidence(
        [{"memory_id": "m", "source_id": "transcript:s1:1", "source_type": "t",
          "source_title": "x", "score": 0.5, "rank": 3}])
    after = datetime.now(UTC)
    assert before <= captured.captured_at <= after
    assert captured.captured_at.utcoffset() == timedelta(0)
    assert captured.source_rank == 3


@pytest.mark.parametrize(
    ("hit", "message"),
    [
        ({"source_id": "transcript:s1:1", "source_type": "t", "source_title": "x",
          "score": 0.5, "rank": 1}, "hits[0].memory_id: missing"),
        ({"memory_id": "m", "source_id": "transcript:s1:1", "source_type": "t",
          "source_title": "x", "score": 0.5}, "hits[0].source_rank: missing"),
        ({"memory_id": "m", "source_id": "transcript:s1:1", "source_type": "t",
          "source_title": "x", "score": 0.5, "rank": 1, "source_rank": 2},
         "hits[0].source_rank: 2 disagrees with rank 1"),
        ({"memory_id": "m", "source_id": "transcript:s1:1", "source_type": "t",
          "source_title": "x", "score": 7, "rank": 1}, "hits[0].score:"),
        ({"memory_id": "m", "source_id": "", "source_type": "t",
          "source_title": "x", "score": 0.5, "rank": 1}, "hits[0].source_id:"),
        ({"memory_id": "m", "source_id": "transcript:s1:1", "source_type": "t",
          "source_title": "x", "score": 0.5, "rank": 1, "captured_at": "2025-01-01T00:00"},
         "hits[0].captured_at: timestamp has no timezone"),
    ],
)
def test_capture_rejects_incomplete_or_invalid_hit(hit: dict[str, Any], message: str) -> None:
    """A hit with a missing or invalid field raises ValueError prefixed with its index."""
    with pytest.raises(ValueError) as info:
        capture_retrieval_evidence([hit], now=T0)
    assert str(info.value).startswith(message), str(info.value)


def test_capture_rejects_repeated_memory_id() -> None:
    """Two hits with the same memory_id cannot both become evidence of one state."""
    hit = {"memory_id": "m", "source_id": "transcript:s1:1", "source_type": "t",
           "source_title": "x", "score": 0.5, "rank": 1}
    with pytest.raises(ValueError, match=r"^hits\[1\]\.memory_id: duplicate id"):
        capture_retrieval_evidence([hit, {**hit, "rank": 2}], now=T0)
