"""How every backend turns a state, a usage row or an audit entry into stored text and back,
and the argument checks both backends make.

A state is the canonical JSON of ``DurableContextState.to_dict()`` with an ISO ``updated_at``
in UTC; decoding validates the whole state, so it is memoised on everything the result is made
of (a row that changed in any way is decoded afresh; errors are never cached). Usage counters
are integers under their field names; times are fixed-width ISO in UTC (they compare as text).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Final, TypeVar

import msgspec

from compactor import DurableContextState
from proxy.accounting.usage import UsageEntry, UsageRow
from proxy.audit.log import SESSION_ORDERS, RequestEntry, StateChange

from .base import CorruptStateError, StoredState

__all__ = [
    "check_bounds",
    "check_change",
    "check_page",
    "decode_audit",
    "decode_state",
    "decode_usage_row",
    "encode_audit",
    "encode_state",
    "retention_cutoff",
    "session_key_of",
    "usage_stamp",
    "utc_now",
]

#: Decoded states kept, least recently used evicted.
DECODED_ROWS: Final = 1024


def encode_state(state: DurableContextState) -> str:
    """The canonical JSON text of ``state``, as every backend stores it."""
    return json.dumps(state.to_dict(), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, allow_nan=False)


def utc_now() -> datetime:
    """The ``updated_at`` of a write: now, timezone-aware, in UTC."""
    return datetime.now(UTC)


def usage_stamp() -> str:
    """The ``last_seen`` of a usage addition: now, in UTC, as fixed-width ISO text."""
    return utc_now().isoformat(timespec="microseconds")


def check_type(name: str, value: object, kind: type) -> None:
    """Refuse an argument of another type than ``kind`` (:class:`TypeError`)."""
    if not isinstance(value, kind):
        raise TypeError(f"{name} must be a {kind.__name__}, got {type(value).__name__}")


def check_bounds(max_summaries: int, max_requests_per_session: int, retention_days: int) -> None:
    """Refuse bounds no store can keep: below 1 (:class:`ValueError`)."""
    for name, value in (("max_summaries", max_summaries),
                        ("max_requests_per_session", max_requests_per_session),
                        ("retention_days", retention_days)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


def check_page(offset: int, limit: int, order: str = SESSION_ORDERS[0]) -> None:
    """Refuse a page of the audit log no store can read: an offset below 0, a limit below 1
    (or either not an integer), an unknown session order (:class:`ValueError`)."""
    for name, value, least in (("offset", offset, 0), ("limit", limit, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    if order not in SESSION_ORDERS:
        raise ValueError(f"order must be one of {', '.join(SESSION_ORDERS)}, got {order!r}")


def session_key_of(tenant: str, session_id: str) -> str:
    """The store key of a tenant's session, as :func:`proxy.http.tenants.scoped_key` makes it."""
    return session_id if tenant == "none" else f"{tenant}/{session_id}"


def check_change(session_id: str, change: StateChange | None, action: str) -> None:
    """Refuse a change a state write cannot record with it: not a :class:`StateChange`
    (:class:`TypeError`), of another action or another session than the one written (its
    records live with the state: one transaction, one Redis hash slot)."""
    if change is None:
        return
    check_type("change", change, StateChange)
    if change.action != action:
        raise ValueError(f"change: a {action} records a {action!r} change, got "
                         f"{change.action!r}")
    if session_key_of(change.tenant, change.session_id) != session_id:
        raise ValueError("change: names another session than the one written")


def lease_ms(ttl_ms: int) -> int:
    """A lease's time to live (milliseconds), refused below 1 (:class:`ValueError`)."""
    if ttl_ms < 1:
        raise ValueError(f"ttl_ms must be >= 1, got {ttl_ms}")
    return int(ttl_ms)


def retention_cutoff(now: datetime, retention_days: int) -> datetime:
    """The oldest time an audit entry may have at ``now``."""
    return now - timedelta(days=retention_days)


_AUDIT_JSON: Final = msgspec.json.Encoder()
_Audit = TypeVar("_Audit", RequestEntry, StateChange)


def encode_audit(item: RequestEntry | StateChange) -> str:
    """The stored text of an audit entry: the compact JSON of its ``as_json()``, as
    ``json.dumps`` writes it. msgspec writes the same bytes, faster, except for a
    ``duration_ms`` written with an exponent or not finite, and a lone surrogate: those go
    through ``json.dumps`` itself."""
    data = item.as_json()
    duration = data.get("duration_ms")
    if not isinstance(duration, float) or duration == 0 or 1e-4 <= abs(duration) < 1e16:
        try:
            return _AUDIT_JSON.encode(data).decode()
        except (TypeError, ValueError, msgspec.EncodeError):
            pass
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def decode_audit(kind: type[_Audit], raw: str | bytes) -> _Audit:
    """A stored request entry or state change (``kind``) read back, or
    :class:`CorruptStateError`."""
    what = "a request entry" if kind is RequestEntry else "a state change"
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise CorruptStateError("<audit log>", f"{what} is not a JSON object")
    try:
        return kind.from_json(data)
    except ValueError as exc:
        raise CorruptStateError("<audit log>", f"{what}: {exc}") from None


def decode_usage_row(session_key: str, model: str, counters: Mapping[str, object],
                     last_seen: object) -> UsageRow:
    """A stored usage row turned back into a :class:`UsageRow`, or :class:`CorruptStateError`:
    a missing counter is 0 (it did not exist yet), a present one an integer >= 0 (or its text)."""
    def problem(detail: str) -> CorruptStateError:
        return CorruptStateError(session_key, f"usage row of model {model!r}: {detail}")

    values: dict[str, int] = {}
    for name in UsageEntry.field_names():
        raw = counters.get(name, 0)
        if isinstance(raw, bytes | str) and raw.isascii() and raw.isdigit():
            raw = int(raw)
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
            raise problem(f"{name} is not an integer >= 0")
        values[name] = raw
    if isinstance(last_seen, bytes):
        last_seen = last_seen.decode("ascii", errors="replace")
    try:
        when = datetime.fromisoformat(last_seen) if isinstance(last_seen, str) else None
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise problem("last_seen is not an ISO time with a zone")
    return UsageRow(session_key=session_key, model=model, entry=UsageEntry(**values),
                    last_seen=when)


@functools.lru_cache(maxsize=DECODED_ROWS)
def decode_state(session_id: str, version: int, state_json: str | bytes,
                 updated_at: str) -> StoredState:
    """A stored row (``version`` checked by the backend) turned back into a frozen, shared
    :class:`StoredState`, or :class:`CorruptStateError`."""
    try:
        data = json.loads(state_json)
    except ValueError as exc:  # UnicodeDecodeError is a ValueError too
        raise CorruptStateError(session_id, f"state is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CorruptStateError(session_id, "state is not a JSON object")
    try:
        state = DurableContextState.from_dict(data)
    except (ValueError, TypeError, KeyError) as exc:
        raise CorruptStateError(session_id, f"state does not validate: {exc}") from None
    try:
        when = datetime.fromisoformat(updated_at)
    except ValueError:
        raise CorruptStateError(session_id, "updated_at is not an ISO timestamp") from None
    if when.tzinfo is None:
        raise CorruptStateError(session_id, "updated_at has no timezone")
    return StoredState(session_id=session_id, version=version, state=state, updated_at=when)
