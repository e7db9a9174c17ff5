"""Tests for proxy.audit.log (the record types' JSON forms and what a state change is
said to have changed) and proxy.audit.report's ``--since`` times."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from compactor import DurableContextState, DurableFact, PendingItem, RetrievalEvidence
from proxy.audit.log import (
    LayerSaving,
    RequestEntry,
    SessionSummary,
    StateChange,
    state_change_detail,
)
from proxy.audit.report import parse_since
from proxy.store._rows import encode_audit

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def fact(fact_id: str, content: str = "c") -> DurableFact:
    return DurableFact(fact_id, content, "transcript:s:1", T0)


def item(item_id: str, status: str = "open", description: str = "d") -> PendingItem:
    return PendingItem(item_id, description, "transcript:s:2", T0, status=status)


def evidence(memory_id: str, score: float = 0.5) -> RetrievalEvidence:
    return RetrievalEvidence(memory_id, "transcript:s:3", "t", "x", T0, score, 1)


@pytest.mark.parametrize(
    ("old", "new", "detail"),
    [
        (None, DurableContextState(facts=[fact("keep-api")], pending_items=[item("changelog")]),
         ("fact keep-api added", "pending changelog added (open)")),
        (DurableContextState(pending_items=[item("changelog")]),
         DurableContextState(pending_items=[item("changelog", "done")]),
         ("pending changelog: open -> done",)),
        (DurableContextState(pending_items=[item("changelog")]),
         DurableContextState(pending_items=[item("changelog", "blocked", "new words")]),
         ("pending changelog changed", "pending changelog: open -> blocked")),
        (DurableContextState(pending_items=[item("changelog")]),
         DurableContextState(pending_items=[item("changelog", description="new words")]),
         ("pending changelog changed",)),
        (DurableContextState(facts=[fact("a"), fact("b")], retrieval_evidence=[evidence("m")]),
         DurableContextState(facts=[fact("b", "other"), fact("c")],
                             retrieval_evidence=[evidence("m", 0.9)]),
         ("fact b changed", "fact c added", "fact a removed", "evidence m changed")),
        (DurableContextState(facts=[fact("a")], pending_items=[item("p", "done")]), None,
         ("fact a removed", "pending p removed")),
        (DurableContextState(facts=[fact("a")]), DurableContextState(facts=[fact("a")]), ()),
    ],
    ids=["created", "status", "status-and-text", "text", "facts-and-evidence", "deleted",
         "unchanged"],
)
def test_state_change_detail_names_ids_and_status_transitions(
    old: DurableContextState | None, new: DurableContextState | None, detail: tuple[str, ...]
) -> None:
    """Added, removed and changed items by id; a pending item's status as old -> new."""
    assert state_change_detail(old, new) == detail


def test_state_change_detail_never_holds_content() -> None:
    """Contents and descriptions stay out, whatever changed."""
    old = DurableContextState(facts=[fact("a", "SECRET-1")],
                              pending_items=[item("p", description="SECRET-2")])
    new = DurableContextState(facts=[fact("a", "SECRET-3")],
                              pending_items=[item("p", "done", "SECRET-4")])
    assert "SECRET" not in " ".join(state_change_detail(old, new))


ENTRY = RequestEntry(
    at=datetime(2026, 12, 1, 10, 0, 0, 5, tzinfo=timezone(timedelta(hours=2))),
    request_id="r1", session_id="s1", tenant="none", route="messages", role="main",
    model="m", tokens_before=10, tokens_after=4, layers=(LayerSaving("L1", 6),),
    outcome="blocked", reason="MessageViewLimitExceeded", hard_limit=5, status=400,
    duration_ms=1.5)


def test_request_entry_json_round_trips_with_times_in_utc() -> None:
    """as_json writes every field (``at`` in UTC, to the microsecond) plus ``blocked``;
    from_json reads it back equal."""
    data = ENTRY.as_json()
    assert data["at"] == "2026-12-01T08:00:00.000005+00:00"
    assert data["layers"] == [{"layer": "L1", "saved": 6}] and data["blocked"] is True
    assert RequestEntry.from_json(data) == ENTRY


@pytest.mark.parametrize(
    ("change", "field"),
    [({"at": "yesterday"}, "at"), ({"tokens_before": "10"}, "tokens_before"),
     ({"layers": [{"layer": "L1"}]}, "layers"), ({"session_id": None}, "session_id"),
     ({"duration_ms": True}, "duration_ms"), ({"status": 1.5}, "status")],
)
def test_request_entry_from_json_names_a_bad_field(change: dict[str, Any], field: str) -> None:
    """A missing or mistyped field is a ValueError starting with its name."""
    with pytest.raises(ValueError, match=f"^{field}: "):
        RequestEntry.from_json({**ENTRY.as_json(), **change})


def test_state_change_json_round_trips() -> None:
    """as_json / from_json keep every field; an unknown action is refused."""
    change = StateChange(at=T0, session_id="s1", tenant="none", actor="admin-api:alice",
                         action="put", version=3, detail=("fact a added",))
    assert StateChange.from_json(change.as_json()) == change
    with pytest.raises(ValueError, match="^action: "):
        StateChange.from_json({**change.as_json(), "action": "patch"})


def _compact_json(data: dict[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


@given(text=st.text(), duration=st.floats(), count=st.none() | st.integers(min_value=0))
@example(text="\ud800 lone surrogate", duration=1e16, count=2**70)
@example(text="\x00\x1f\x7f\u2028\"\\", duration=0.00001, count=0)
def test_an_entry_is_stored_as_the_compact_json_of_its_json_form(
        text: str, duration: float, count: int | None) -> None:
    """encode_audit writes what ``json.dumps`` (compact, not ASCII, no NaN) writes, byte for
    byte, and refuses what it refuses."""
    entry = RequestEntry(at=T0, request_id=text, session_id=text, tenant="none",
                         route="messages", model=text, tokens_before=count,
                         layers=(LayerSaving(text, 3),), outcome="forwarded", reason=text,
                         duration_ms=duration)
    change = StateChange(at=T0, session_id=text, tenant="none", actor=text, action="put",
                         version=count, detail=(text,))
    assert encode_audit(change) == _compact_json(change.as_json())
    if math.isfinite(duration):
        assert encode_audit(entry) == _compact_json(entry.as_json())
    else:
        with pytest.raises(ValueError):
            encode_audit(entry)


def test_saved_ratio_is_none_when_nothing_was_counted() -> None:
    """A session whose requests carried no token counts has no ratio, in JSON too."""
    summary = SessionSummary("s1", "none", T0, requests=2, tokens_before=0, tokens_after=0,
                             blocked=2)
    assert summary.saved_ratio is None and summary.as_json()["saved_ratio"] is None


NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("30m", NOW - timedelta(minutes=30)), ("1h", NOW - timedelta(hours=1)),
     ("2d", NOW - timedelta(days=2)), ("45s", NOW - timedelta(seconds=45)),
     ("1w", NOW - timedelta(weeks=1)),
     ("2026-12-01T09:00:00Z", datetime(2026, 12, 1, 9, tzinfo=UTC)),
     ("2026-12-01T09:00:00+02:00", datetime(2026, 12, 1, 7, tzinfo=UTC)),
     ("2026-12-01T09:00", datetime(2026, 12, 1, 9, tzinfo=UTC)),
     ("2026-12-01", datetime(2026, 12, 1, tzinfo=UTC))],
)
def test_since_is_a_span_back_from_now_or_an_iso_time(text: str, expected: datetime) -> None:
    """30m, 1h, 2d (and s, w) count back from now; an ISO time without a zone is UTC."""
    assert parse_since(text, NOW) == expected


@pytest.mark.parametrize("text", ["", "1", "h", "0h", "-1h", "1.5h", "1y", "soon", "1 h"])
def test_since_refuses_anything_else(text: str) -> None:
    """Anything else is a ValueError naming --since and what it takes."""
    with pytest.raises(ValueError, match="^--since: .* 30m, 1h, 2d"):
        parse_since(text, NOW)


@given(st.datetimes(timezones=st.sampled_from(
    [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-11))])))
@example(datetime(2026, 12, 4, 16, 0, 0, 0, tzinfo=UTC))
@example(datetime(2026, 12, 4, 16, 0, 0, 5, tzinfo=UTC))
def test_an_entry_s_time_is_fixed_width_iso_8601_in_utc(when: datetime) -> None:
    """The stored time is what ``isoformat(timespec="microseconds")`` of the UTC time writes
    (msgspec writes it, in a tenth of the time): a zero fraction and the offset spelt out."""
    from proxy.audit.log import utc_iso

    assert utc_iso(when) == when.astimezone(UTC).isoformat(timespec="microseconds")
