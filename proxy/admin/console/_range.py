"""The time range and request-id filter of the request pages, read from the query string.

``?range=`` picks a preset; ``?from=`` and ``?to=`` (the browser's ``datetime-local`` form,
read as UTC, or ISO 8601 with an offset) win over it; ``?rid=`` keeps the requests whose id
contains it. A value that cannot be read is named in :attr:`RequestFilter.problem` and ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from proxy.audit.log import RequestEntry

__all__ = ["PRESETS", "RequestFilter", "request_filter"]

#: The presets, by their query value.
PRESETS: Final[Mapping[str, timedelta | None]] = {
    "1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7),
    "30d": timedelta(days=30), "all": None}
_MINUTE: Final = timedelta(minutes=1)
_TICK: Final = timedelta(microseconds=1)
#: The longest request id searched for (an id is 24 hex digits).
_RID_MAX: Final = 64


@dataclass(frozen=True, slots=True)
class RequestFilter:
    """Which requests a page shows: arrivals from ``since`` to ``until`` (``None``: no bound)
    whose id contains ``request_id``; ``preset`` is ``""`` when ``from``/``to`` set the
    range, whose values as given are ``since_text`` and ``until_text``."""

    preset: str
    since: datetime | None
    until: datetime | None
    request_id: str
    problem: str | None = None
    since_text: str = ""
    until_text: str = ""

    @property
    def active(self) -> bool:
        """Whether anything is filtered out."""
        return self.since is not None or self.until is not None or bool(self.request_id)

    def keeps(self, entry: RequestEntry) -> bool:
        """Whether ``entry`` is in the range and matches the request id."""
        if self.since is not None and entry.at < self.since:
            return False
        if self.until is not None and entry.at > self.until:
            return False
        return not self.request_id or self.request_id in entry.request_id.lower()


def _when(name: str, raw: str) -> datetime:
    try:
        when = datetime.fromisoformat(raw)
    except ValueError:
        raise ValueError(f"{name}: not a time like 2026-12-05T09:30 (UTC)") from None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def request_filter(query: Mapping[str, str], *, default: str = "all",
                   now: datetime | None = None) -> RequestFilter:
    """The filter ``query`` asks for (``default``: the preset when it names none)."""
    now = now or datetime.now(UTC)
    preset = query.get("range", default)
    if preset not in PRESETS:
        preset = default
    span = PRESETS[preset]
    since: datetime | None = None if span is None else now - span
    until: datetime | None = None
    problems: list[str] = []
    since_text = query.get("from", "").strip()[:40]
    until_text = query.get("to", "").strip()[:40]
    if since_text or until_text:
        preset, since = "", None
    for name, text in (("from", since_text), ("to", until_text)):
        if not text:
            continue
        try:
            when = _when(name, text)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        if name == "from":
            since = when
        else:  # a time to the minute (the browser's form) ends with that minute
            until = when + _MINUTE - _TICK if len(text) == len("2026-12-05T09:30") else when
    rid = "".join(query.get("rid", "").split()).lower()[:_RID_MAX]
    return RequestFilter(preset=preset, since=since, until=until, request_id=rid,
                         problem="; ".join(problems) or None, since_text=since_text,
                         until_text=until_text)
