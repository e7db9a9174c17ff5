"""The overview's trend: requests put in hourly or daily buckets, and the bars an inline SVG
draws of them (no JavaScript)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Final

from proxy.admin.console._totals import PriceFor, Totals, request_cost
from proxy.audit.log import RequestEntry

__all__ = ["Bar", "Bucket", "Trend", "trend"]

WIDTH: Final = 1000
HEIGHT: Final = 220
_LEFT: Final = 64
_RIGHT: Final = 16
_TOP: Final = 12
_BOTTOM: Final = 32
#: The most buckets drawn (the newest).
MAX_BUCKETS: Final = 90
#: Up to this span the buckets are hours, above it days.
_HOURLY_UP_TO: Final = timedelta(hours=48)


@dataclass(slots=True)
class Bucket:
    """One hour or day: when it starts and its requests' totals."""

    start: datetime
    totals: Totals = field(default_factory=Totals)


@dataclass(frozen=True, slots=True)
class Bar:
    """One bucket drawn: where, how tall its before and after bars are, and its label."""

    x: float
    width: float
    y_before: float
    y_after: float
    label: str
    bucket: Bucket


@dataclass(frozen=True, slots=True)
class Trend:
    """The buckets (oldest first), their bars and the frame."""

    unit: str
    buckets: tuple[Bucket, ...]
    bars: tuple[Bar, ...]
    width: int = WIDTH
    height: int = HEIGHT
    left: int = _LEFT
    right: int = WIDTH - _RIGHT
    top: int = _TOP
    bottom: int = HEIGHT - _BOTTOM
    peak: int = 0


def _floor(when: datetime, step: timedelta) -> datetime:
    when = when.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return when.replace(hour=0) if step == timedelta(days=1) else when


def trend(entries: Sequence[RequestEntry], price_for: PriceFor, *, since: datetime | None,
          until: datetime | None, now: datetime | None = None) -> Trend:
    """``entries`` by hour (a range of up to 48 hours) or by day, every bucket of the range
    present (empty ones too), at most :data:`MAX_BUCKETS` of the newest."""
    now = now or datetime.now(UTC)
    end = until or now
    start = since or min((entry.at for entry in entries), default=end)
    step = timedelta(hours=1) if end - start <= _HOURLY_UP_TO else timedelta(days=1)
    first = max(_floor(start, step), _floor(end, step) - step * (MAX_BUCKETS - 1))
    buckets: dict[datetime, Bucket] = {}
    at = first
    while at <= end:
        buckets[at] = Bucket(at)
        at += step
    for entry in entries:
        bucket = buckets.get(_floor(entry.at, step))
        if bucket is not None:
            bucket.totals.add(entry, request_cost(entry, price_for))
    ordered = tuple(buckets.values())
    peak = max((b.totals.tokens_before for b in ordered), default=0)
    frame_top, frame_bottom = _TOP, HEIGHT - _BOTTOM
    span = WIDTH - _RIGHT - _LEFT
    slot = span / max(1, len(ordered))

    def y_of(tokens: int) -> float:
        return frame_bottom - (frame_bottom - frame_top) * (tokens / peak if peak else 0)

    label_every = max(1, -(-len(ordered) // 12))
    fmt = "%H:00" if step < timedelta(days=1) else "%m-%d"
    bars = tuple(
        Bar(x=_LEFT + slot * index + slot * 0.15, width=slot * 0.7,
            y_before=y_of(bucket.totals.tokens_before), y_after=y_of(bucket.totals.tokens_after),
            label=bucket.start.strftime(fmt) if index % label_every == 0 else "",
            bucket=bucket)
        for index, bucket in enumerate(ordered))
    return Trend(unit="hour" if step < timedelta(days=1) else "day", buckets=ordered,
                 bars=bars, peak=peak)
