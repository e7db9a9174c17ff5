"""The session page's chart, as plain geometry for an inline SVG (no JavaScript).

One point per request, oldest first: the tokens before compaction and after (what was
forwarded, or what would have been for a refused request), with the role's soft and hard
thresholds as horizontal lines. :func:`token_chart` computes every coordinate; the template
only draws them. Everything in ``__all__`` gets re-exported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from proxy.state.audit_log import RequestEntry

__all__ = ["ChartPoint", "TokenChart", "token_chart"]

WIDTH: Final = 1000
HEIGHT: Final = 300
_LEFT: Final = 64  # room for the y-axis labels
_RIGHT: Final = 96  # room for the thresholds' labels
_TOP: Final = 16
_BOTTOM: Final = 36  # room for the x-axis labels
_Y_TICKS: Final = 5
_X_LABELS: Final = 10


@dataclass(frozen=True, slots=True)
class ChartPoint:
    """One request on the chart (SVG user units; ``None``: the figure is unknown)."""

    number: int
    request_id: str
    x: float
    y_before: float | None
    y_after: float | None
    tokens_before: int | None
    tokens_after: int | None
    blocked: bool


@dataclass(frozen=True, slots=True)
class Tick:
    """An axis label and where it goes."""

    at: float
    label: str


@dataclass(frozen=True, slots=True)
class TokenChart:
    """Everything the template draws."""

    width: int
    height: int
    left: int
    right: float
    top: int
    bottom: float
    points: tuple[ChartPoint, ...]
    before_path: str
    after_path: str
    soft: int
    hard: int
    y_soft: float
    y_hard: float
    y_ticks: tuple[Tick, ...]
    x_ticks: tuple[Tick, ...]


def _nice_ceiling(value: float) -> int:
    """The smallest 1, 2 or 5 times a power of ten that is at least ``value``."""
    magnitude = 1
    while True:
        for step in (1, 2, 5):
            if step * magnitude >= value:
                return step * magnitude
        magnitude *= 10


def _label(tokens: int) -> str:
    if tokens >= 1_000_000 and tokens % 100_000 == 0:
        return f"{tokens / 1_000_000:g}M"
    if tokens >= 1_000 and tokens % 100 == 0:
        return f"{tokens / 1_000:g}k"
    return f"{tokens:,}"


def _path(points: Sequence[tuple[float, float | None]]) -> str:
    """An SVG path through the known points; an unknown figure breaks the line."""
    parts: list[str] = []
    pen_down = False
    for x, y in points:
        if y is None:
            pen_down = False
            continue
        parts.append(f"{'L' if pen_down else 'M'}{x:.1f},{y:.1f}")
        pen_down = True
    return " ".join(parts)


def token_chart(entries: Sequence[RequestEntry], *, soft: int, hard: int) -> TokenChart:
    """The chart of ``entries`` (oldest first) with the ``soft`` and ``hard`` thresholds."""
    right = WIDTH - _RIGHT
    bottom = HEIGHT - _BOTTOM
    figures = [value for entry in entries for value in (entry.tokens_before, entry.tokens_after)
               if value is not None]
    top_value = _nice_ceiling(max([hard, soft, *figures, 1]) * 1.1)

    def y_of(tokens: int | None) -> float | None:
        if tokens is None:
            return None
        return bottom - (bottom - _TOP) * min(tokens, top_value) / top_value

    count = len(entries)
    span = right - _LEFT

    def x_of(index: int) -> float:
        if count == 1:
            return _LEFT + span / 2
        return _LEFT + span * index / (count - 1)

    points = tuple(
        ChartPoint(number=index + 1, request_id=entry.request_id, x=x_of(index),
                   y_before=y_of(entry.tokens_before), y_after=y_of(entry.tokens_after),
                   tokens_before=entry.tokens_before, tokens_after=entry.tokens_after,
                   blocked=entry.blocked)
        for index, entry in enumerate(entries)
    )
    step = max(1, -(-count // _X_LABELS))
    x_ticks = tuple(Tick(point.x, str(point.number)) for point in points
                    if (point.number - 1) % step == 0 or point.number == count)
    y_ticks = tuple(Tick(bottom - (bottom - _TOP) * k / _Y_TICKS,
                         _label(top_value * k // _Y_TICKS)) for k in range(_Y_TICKS + 1))
    soft_y, hard_y = y_of(soft), y_of(hard)
    assert soft_y is not None and hard_y is not None
    return TokenChart(
        width=WIDTH, height=HEIGHT, left=_LEFT, right=right, top=_TOP, bottom=bottom,
        points=points,
        before_path=_path([(p.x, p.y_before) for p in points]),
        after_path=_path([(p.x, p.y_after) for p in points]),
        soft=soft, hard=hard, y_soft=soft_y, y_hard=hard_y,
        y_ticks=y_ticks, x_ticks=x_ticks,
    )
