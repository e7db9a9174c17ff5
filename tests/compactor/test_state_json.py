"""Durable state in text: ISO 8601 timestamps, the JSON form, pending status, from_dict errors."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compactor._state import DurableContextState
from compactor._state_items import DurableFact, PendingItem, RetrievalEvidence
from tests.compactor.state_items import NAIVE, T0, evidence, fact, item

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
