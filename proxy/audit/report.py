"""``compact-proxy sessions``, ``session`` and ``blocked``: the audit log laid out as tables
(figures only, times in UTC) or JSON (the items' ``as_json()``, as the admin API answers), and
the ``--since`` times they take. No I/O: the commands read the store, then call these.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from compactor import SourceResolution
from proxy.audit.log import RequestEntry, SessionSummary, StateChange
from proxy.store import StoredState

__all__ = ["aligned_table", "blocked_table", "parse_since", "session_json", "session_text",
           "sessions_table"]

_SPAN: Final = re.compile(r"([1-9][0-9]{0,6})([smhdw])")
_UNITS: Final = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_since(text: str, now: datetime) -> datetime:
    """The time ``--since`` names: a span back from ``now`` (``30m``, ``1h``, ``2d``; also
    ``s`` and ``w``) or an ISO time (UTC when it has no zone); else a ValueError."""
    value = text.strip()
    span = _SPAN.fullmatch(value)
    if span is not None:
        return now - timedelta(**{_UNITS[span.group(2)]: int(span.group(1))})
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"--since: {text!r} is neither a span like 30m, 1h, 2d nor an ISO "
                         "time like 2026-12-01T09:00:00Z") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _time(when: datetime) -> str:
    """A time as the tables show it: UTC, to the second, with a ``Z``."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _figure(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def aligned_table(header: Sequence[str], rows: Sequence[Sequence[str]], *, left: int) -> str:
    """Aligned columns: the first ``left`` columns flush left, the others flush right."""
    table = [header, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) if i < left else cell.rjust(width)
                  for i, (cell, width) in enumerate(zip(row, widths, strict=True))).rstrip()
        for row in table
    ) + "\n"


_SESSIONS_HEADER: Final = ("SESSION", "TENANT", "LAST_SEEN", "REQUESTS", "TOKENS_BEFORE",
                           "TOKENS_AFTER", "SAVED_%", "BLOCKED")


def sessions_table(summaries: Sequence[SessionSummary], total: int) -> str:
    """One line per session, newest first as given; a last line says how many were left out."""
    rows = []
    for summary in summaries:
        ratio = summary.saved_ratio
        rows.append((summary.session_id, summary.tenant, _time(summary.last_seen),
                     f"{summary.requests:,}", f"{summary.tokens_before:,}",
                     f"{summary.tokens_after:,}",
                     "n/a" if ratio is None else f"{ratio * 100:.1f}%", f"{summary.blocked:,}"))
    text = aligned_table(_SESSIONS_HEADER, rows, left=3)
    if total > len(summaries):
        text += f"({len(summaries)} of {total} sessions; --offset and --limit page through)\n"
    return text


_REQUESTS_HEADER: Final = ("AT", "ROUTE", "ROLE", "MODEL", "OUTCOME", "REASON", "LAYERS",
                           "STATUS", "TOKENS_BEFORE", "TOKENS_AFTER", "USAGE_IN", "USAGE_OUT",
                           "MS")


def _layers(entry: RequestEntry) -> str:
    return ",".join(f"{saving.layer}:{saving.saved}" for saving in entry.layers) or "-"


def _usage_in(entry: RequestEntry) -> int | None:
    parts = (entry.usage_input, entry.usage_cache_read, entry.usage_cache_write)
    return None if all(part is None for part in parts) else sum(part or 0 for part in parts)


def _request_row(entry: RequestEntry) -> tuple[str, ...]:
    return (_time(entry.at), entry.route, entry.role or "-", entry.model or "-",
            entry.outcome or "-", entry.reason or "-", _layers(entry),
            "-" if entry.status is None else str(entry.status), _figure(entry.tokens_before),
            _figure(entry.tokens_after), _figure(_usage_in(entry)), _figure(entry.usage_output),
            f"{entry.duration_ms:.0f}")


def _state_lines(stored: StoredState, statuses: dict[str, SourceResolution]) -> list[str]:
    """One line per item: kind, id, (status,) pointer and its source's status; no content."""
    def source(pointer: str) -> str:
        resolution = statuses.get(pointer)
        return f"{pointer} ({'unresolved' if resolution is None else resolution.status})"

    state = stored.state
    lines = [f"durable state: version {stored.version}, updated {_time(stored.updated_at)}"]
    lines += [f"  fact {fact.fact_id}  {source(fact.source_pointer)}" for fact in state.facts]
    lines += [f"  pending {item.item_id}  status={item.status}  {source(item.source_pointer)}"
              for item in state.pending_items]
    lines += [f"  evidence {ev.memory_id}  {source(ev.source_id)}"
              for ev in state.retrieval_evidence]
    if state.is_empty:
        lines.append("  (empty)")
    return lines


def session_text(session_id: str, tenant: str, entries: Sequence[RequestEntry], total: int,
                 stored: StoredState | None, statuses: Sequence[SourceResolution],
                 changes: Sequence[StateChange]) -> str:
    """A session: its requests (newest first) as a table, its durable state with each
    pointer's status, and its state changes."""
    text = f"session {session_id} (tenant {tenant}): {total:,} requests in the audit log\n"
    if entries:
        text += aligned_table(_REQUESTS_HEADER, [_request_row(entry) for entry in entries],
                              left=7)
        if total > len(entries):
            text += f"({len(entries)} newest of {total}; --limit shows more)\n"
    by_pointer = {resolution.pointer: resolution for resolution in statuses}
    text += "\n".join(_state_lines(stored, by_pointer) if stored is not None
                      else ["durable state: none"]) + "\n"
    if changes:
        text += "state changes (newest first):\n"
        text += "".join(f"  {_time(change.at)}  {change.actor}  {change.action}"
                        f"{'' if change.version is None else f' v{change.version}'}"
                        f"  {'; '.join(change.detail) or '(no change)'}\n"
                        for change in changes)
    return text


def session_json(session_id: str, tenant: str, entries: Sequence[RequestEntry], total: int,
                 stored: StoredState | None, statuses: Sequence[SourceResolution],
                 changes: Sequence[StateChange]) -> dict[str, Any]:
    """The same as one JSON object: ``requests`` (and their ``total``), ``state`` (the admin
    API's body, with ``sources``: each pointer's status) and ``changes``."""
    state: dict[str, Any] | None = None
    if stored is not None:
        state = {"version": stored.version, "updated_at": stored.updated_at.isoformat(),
                 **stored.state.to_dict(),
                 "sources": [{"pointer": r.pointer, "status": r.status,
                              "evidence_sha256": r.evidence_sha256, "detail": r.detail}
                             for r in statuses]}
    return {"session_id": session_id, "tenant": tenant,
            "requests": [entry.as_json() for entry in entries], "total": total,
            "state": state, "changes": [change.as_json() for change in changes]}


_BLOCKED_HEADER: Final = ("AT", "SESSION", "TENANT", "REASON", "TOKENS_BEFORE", "TOKENS_AFTER",
                          "HARD_LIMIT")


def blocked_table(entries: Sequence[RequestEntry]) -> str:
    """One line per refused request, oldest first as given."""
    return aligned_table(_BLOCKED_HEADER, [
        (_time(entry.at), entry.session_id, entry.tenant, entry.reason or "-",
         _figure(entry.tokens_before), _figure(entry.tokens_after), _figure(entry.hard_limit))
        for entry in entries], left=4)
