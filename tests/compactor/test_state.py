"""Durable state types: construction checks, JSON round trip, pointer listing, capture."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compactor._state import DurableContextState, capture_retrieval_evidence
from compactor._state_items import DurableFact, PendingItem, RetrievalEvidence

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
NAIVE = datetime(2025, 3, 1, 12, 0)


def fact(fact_id: str = "f1", pointer: str = "transcript:s1:1") -> DurableFact:
    return DurableFact(fact_id, "the build uses uv", pointer, T0)


def item(item_id: str = "p1", pointer: str = "transcript:s1:2") -> PendingItem:
    return PendingItem(item_id, "rotate the staging key", pointer, T0)


def evidence(memory_id: str = "m1", source_id: str = "transcript:s1:3",
             **overrides: Any) -> RetrievalEvidence:
    values: dict[str, Any] = dict(
        memory_id=memory_id, source_id=source_id, source_type="transcript",
        source_title="design review", captured_at=T0, score=0.5, source_rank=1,
    )
    values.update(overrides)
    return RetrievalEvidence(**values)


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


# --- timestamps given as ISO 8601 strings -----------------------------------------------


def test_the_seeds_string_timestamps_are_accepted() -> None:
    """The seed's own call works: an ISO 8601 string with an offset (or Z) is a timestamp."""
    f = DurableFact("f1", "SQLite WAL", "transcript:s1:1", "2026-11-30T10:00:00+00:00")
    assert f.last_confirmed_at == datetime(2026, 11, 30, 10, tzinfo=UTC)
    assert isinstance(f.last_confirmed_at, datetime)
    p = PendingItem("p1", "rotate the key", "transcript:s1:2", "2026-11-30T10:00:00Z")
    assert p.last_confirmed_at == datetime(2026, 11, 30, 10, tzinfo=UTC)
    e = RetrievalEvidence("m1", "transcript:s1:3", "transcript", "review",
                          "2026-11-30T12:00:00+02:00", 0.5, 1)
    assert e.captured_at == datetime(2026, 11, 30, 10, tzinfo=UTC)
    assert e.captured_at.utcoffset() == timedelta(hours=2)


@pytest.mark.parametrize("stamp", ["2026-11-30T10:00:00+00:00", "2026-11-30T10:00:00Z",
                                   "2026-11-30T11:00:00+01:00"])
def test_string_and_datetime_forms_give_the_same_state(stamp: str) -> None:
    """A string and the equivalent aware datetime: equal items, same to_dict, same rendering."""
    from compactor import SourceResolution, render_durable_context

    as_datetime = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    by_string = DurableContextState(
        facts=[DurableFact("f1", "SQLite WAL", "transcript:s1:1", stamp)],
        pending_items=[PendingItem("p1", "d", "transcript:s1:2", stamp)],
        retrieval_evidence=[RetrievalEvidence("m1", "transcript:s1:3", "t", "x", stamp, 0.5, 1)])
    by_datetime = DurableContextState(
        facts=[DurableFact("f1", "SQLite WAL", "transcript:s1:1", as_datetime)],
        pending_items=[PendingItem("p1", "d", "transcript:s1:2", as_datetime)],
        retrieval_evidence=[RetrievalEvidence("m1", "transcript:s1:3", "t", "x", as_datetime,
                                              0.5, 1)])
    assert by_string == by_datetime
    assert by_string.to_dict() == by_datetime.to_dict()
    assert DurableContextState.from_dict(by_string.to_dict()) == by_datetime
    resolutions = [SourceResolution(p, "missing", None, "x")
                   for p in by_string.source_pointers()]
    rendered = render_durable_context(by_string, source_resolutions=resolutions)
    assert rendered == render_durable_context(by_datetime, source_resolutions=resolutions)
    assert "last_confirmed_at=2026-11-30T10:00:00Z" in rendered


@pytest.mark.parametrize(("stamp", "problem"), [
    ("2026-11-30T10:00:00", "timestamp has no timezone"),
    ("2026-11-30", "timestamp has no timezone"),
    ("yesterday", "'yesterday' is not an ISO 8601 timestamp"),
    ("", "'' is not an ISO 8601 timestamp"),
    ("30/11/2026 10:00 +00:00", "is not an ISO 8601 timestamp"),
])
def test_naive_or_non_iso_strings_are_refused_naming_the_field(stamp: str, problem: str) -> None:
    """A string without a timezone, or not ISO 8601 at all, is refused like a naive datetime."""
    for build, field in [
        (lambda: DurableFact("f1", "c", "transcript:s1:1", stamp), "last_confirmed_at"),
        (lambda: PendingItem("p1", "d", "transcript:s1:2", stamp), "last_confirmed_at"),
        (lambda: evidence(captured_at=stamp), "captured_at"),
    ]:
        with pytest.raises(ValueError) as info:
            build()
        assert str(info.value).startswith(f"{field}: ") and problem in str(info.value)


def test_replace_keeps_working_with_either_form() -> None:
    """dataclasses.replace goes through the same construction (string or datetime)."""
    from dataclasses import replace

    f = DurableFact("f1", "c", "transcript:s1:1", T0)
    assert replace(f, last_confirmed_at="2025-03-01T12:00:00Z") == f
    with pytest.raises(ValueError, match="^last_confirmed_at: timestamp has no timezone"):
        replace(f, last_confirmed_at=NAIVE)


# --- JSON form ------------------------------------------------------------------------


def test_to_dict_uses_dataclass_field_names_and_iso_timestamps() -> None:
    """to_dict gives the admin API shape with ISO 8601 timestamps, and it is JSON-ready."""
    state = DurableContextState(facts=[fact()], pending_items=[item()],
                                retrieval_evidence=[evidence(conflict_key="deploy-target")])
    data = state.to_dict()
    assert data == {
        "facts": [{"fact_id": "f1", "content": "the build uses uv",
                   "source_pointer": "transcript:s1:1",
                   "last_confirmed_at": "2025-03-01T12:00:00+00:00"}],
        "pending_items": [{"item_id": "p1", "description": "rotate the staging key",
                           "source_pointer": "transcript:s1:2",
                           "last_confirmed_at": "2025-03-01T12:00:00+00:00",
                           "status": "open"}],
        "retrieval_evidence": [{"memory_id": "m1", "source_id": "transcript:s1:3",
                                "source_type": "transcript", "source_title": "design review",
                                "captured_at": "2025-03-01T12:00:00+00:00", "score": 0.5,
                                "source_rank": 1, "conflict_key": "deploy-target"}],
    }
    assert json.loads(json.dumps(data)) == data


def test_from_dict_accepts_z_suffix_and_missing_lists() -> None:
    """from_dict reads 'Z' timestamps, takes absent lists as empty and conflict_key as optional."""
    state = DurableContextState.from_dict({
        "retrieval_evidence": [{"memory_id": "m1", "source_id": "transcript:s1:3",
                                "source_type": "", "source_title": "",
                                "captured_at": "2025-03-01T12:00:00Z", "score": 1,
                                "source_rank": 2}],
    })
    assert state.facts == () and state.pending_items == ()
    assert state.retrieval_evidence[0].captured_at == T0
    assert state.retrieval_evidence[0].conflict_key is None


# --- pending items' status -------------------------------------------------------------


@pytest.mark.parametrize("status", ["open", "blocked", "done"])
def test_pending_status_is_kept_and_round_trips(status: str) -> None:
    """Each status is kept, written by to_dict and read back by from_dict."""
    kept = PendingItem("p1", "d", "transcript:s1:2", T0, status=status)
    assert kept.status == status
    assert kept.to_dict()["status"] == status
    assert PendingItem.from_dict(kept.to_dict()) == kept


def test_pending_status_defaults_to_open() -> None:
    """A new item is open."""
    assert item().status == "open"


def test_a_stored_pending_item_without_status_reads_as_open() -> None:
    """A state written before pending items had a status loads, each item open."""
    state = DurableContextState.from_dict({"pending_items": [
        {"item_id": "p1", "description": "d", "source_pointer": "transcript:s1:2",
         "last_confirmed_at": "2025-03-01T12:00:00Z"}]})
    assert state.pending_items[0].status == "open"


def test_an_unknown_pending_status_is_refused_naming_the_field() -> None:
    """from_dict names the item's status and lists the statuses."""
    with pytest.raises(ValueError) as info:
        DurableContextState.from_dict({"pending_items": [
            {"item_id": "p1", "description": "d", "source_pointer": "transcript:s1:2",
             "last_confirmed_at": "2025-03-01T12:00:00Z", "status": "finished"}]})
    assert str(info.value) == ("pending_items[0].status: must be one of open, blocked, done, "
                               "got 'finished'")


def test_from_dict_of_empty_object_is_empty_state() -> None:
    """An empty object is the empty state."""
    assert DurableContextState.from_dict({}) == DurableContextState()


GOOD_FACT = {"fact_id": "f1", "content": "c", "source_pointer": "transcript:s1:1",
             "last_confirmed_at": "2025-03-01T12:00:00+01:00"}
GOOD_EVIDENCE = {"memory_id": "m1", "source_id": "transcript:s1:3", "source_type": "t",
                 "source_title": "x", "captured_at": "2025-03-01T12:00:00Z", "score": 0.5,
                 "source_rank": 1, "conflict_key": None}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "state: must be an object"),
        ({"session_id": "s1"}, "session_id: unknown field"),
        ({"facts": None}, "facts: must be a list"),
        ({"facts": {"0": GOOD_FACT}}, "facts: must be a list"),
        ({"facts": [GOOD_FACT, "x"]}, "facts[1]: must be an object"),
        ({"facts": [GOOD_FACT, {**GOOD_FACT, "fact_id": "f2",
                                "last_confirmed_at": "2025-03-01T12:00:00"}]},
         "facts[1].last_confirmed_at: timestamp has no timezone"),
        ({"facts": [{**GOOD_FACT, "last_confirmed_at": "yesterday"}]},
         "facts[0].last_confirmed_at: 'yesterday' is not an ISO 8601 timestamp"),
        ({"facts": [{**GOOD_FACT, "last_confirmed_at": 1700000000}]},
         "facts[0].last_confirmed_at: must be an ISO 8601 string"),
        ({"facts": [{**GOOD_FACT, "last_confirmed_at": "2025-03-01"}]},
         "facts[0].last_confirmed_at: timestamp has no timezone"),
        ({"facts": [{k: v for k, v in GOOD_FACT.items() if k != "content"}]},
         "facts[0].content: missing"),
        ({"facts": [{**GOOD_FACT, "extra": 1}]}, "facts[0].extra: unknown field"),
        ({"facts": [GOOD_FACT, GOOD_FACT]}, "facts[1].fact_id: duplicate id"),
        ({"facts": [{**GOOD_FACT, "fact_id": ""}]}, "facts[0].fact_id: must not be empty"),
        ({"pending_items": [{"item_id": "p", "description": "d",
                             "source_pointer": "transcript:s1:1"}]},
         "pending_items[0].last_confirmed_at: missing"),
        ({"retrieval_evidence": [{**GOOD_EVIDENCE, "score": 1.5}]},
         "retrieval_evidence[0].score: must be in [0, 1]"),
        ({"retrieval_evidence": [{**GOOD_EVIDENCE, "score": True}]},
         "retrieval_evidence[0].score:"),
        ({"retrieval_evidence": [{**GOOD_EVIDENCE, "source_rank": 0}]},
         "retrieval_evidence[0].source_rank: must be >= 1"),
        ({"retrieval_evidence": [{**GOOD_EVIDENCE, "source_rank": 1.0}]},
         "retrieval_evidence[0].source_rank: must be an integer"),
        ({"retrieval_evidence": [{**GOOD_EVIDENCE, "text": "recalled words"}]},
         "retrieval_evidence[0].text: unknown field"),
    ],
)
def test_from_dict_error_message_starts_with_field_path(data: Any, message: str) -> None:
    """Invalid input raises ValueError whose message starts with the path of the bad field."""
    with pytest.raises(ValueError) as info:
        DurableContextState.from_dict(data)
    assert str(info.value).startswith(message), str(info.value)


_offsets = st.integers(min_value=-(24 * 60 - 1), max_value=24 * 60 - 1).map(
    lambda minutes: timezone(timedelta(minutes=minutes)))
_aware = st.datetimes(min_value=datetime(2, 1, 1), max_value=datetime(9998, 12, 31),
                      timezones=_offsets)
_ids = st.text(min_size=1, max_size=20).filter(lambda s: s.strip() != "")
_facts = st.builds(DurableFact, fact_id=_ids, content=_ids, source_pointer=_ids,
                   last_confirmed_at=_aware)
_items = st.builds(PendingItem, item_id=_ids, description=_ids, source_pointer=_ids,
                   last_confirmed_at=_aware, status=st.sampled_from(["open", "blocked", "done"]))
_evidence = st.builds(
    RetrievalEvidence, memory_id=_ids, source_id=_ids, source_type=st.text(max_size=10),
    source_title=st.text(max_size=10), captured_at=_aware,
    score=st.floats(min_value=0.0, max_value=1.0), source_rank=st.integers(1, 10**6),
    conflict_key=st.none() | _ids,
)
_states = st.builds(
    DurableContextState,
    facts=st.lists(_facts, max_size=4, unique_by=lambda f: f.fact_id),
    pending_items=st.lists(_items, max_size=4, unique_by=lambda p: p.item_id),
    retrieval_evidence=st.lists(_evidence, max_size=4, unique_by=lambda e: e.memory_id),
)


@given(_states)
def test_to_dict_from_dict_round_trip_through_json(state: DurableContextState) -> None:
    """Any valid state survives to_dict -> JSON text -> from_dict unchanged, instant for instant."""
    data = json.loads(json.dumps(state.to_dict()))
    again = DurableContextState.from_dict(data)
    assert again == state
    assert again.to_dict() == state.to_dict()


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
