"""The session page's chart, as plain geometry for an inline SVG (no JavaScript).

One point per request, oldest first: the tokens before compaction and after, against the
soft and hard thresholds each request was judged by (its audit entry's) as step lines, so a
request refused at an old limit is drawn against that limit. The template only draws.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from proxy.audit.log import RequestEntry

__all__ = ["ChartPoint", "TokenChart", "token_chart"]

WIDTH: Final = 1000
HEIGHT: Final = 300
_LEFT: Final = 64  # room for the y-axis labels
_RIGHT: Final = 96  # room for the thresholds' labels
_TOP: Final = 16
_BOTTOM: Final = 36  # room for the x-axis labels
_Y_TICKS: Final = 5
_X_LABELS: Final = 10
#: The least distance between the soft and hard labels' baselines (their font is 12 units).
_LABEL_GAP: Final = 14


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
    soft: int
    hard: int


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
    soft_path: str
    hard_path: str
    y_soft_label: float
    y_hard_label: float
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


def _steps(points: Sequence[ChartPoint], y_of: Callable[[int], float], which: str,
           left: float, right: float) -> str:
    """A step line through each point's ``soft`` or ``hard`` threshold, level half-way to
    each neighbour, the first and last reaching the frame."""
    if not points:
        return ""
    parts: list[str] = []
    for index, point in enumerate(points):
        start = left if index == 0 else (points[index - 1].x + point.x) / 2
        end = right if index == len(points) - 1 else (point.x + points[index + 1].x) / 2
        y = y_of(getattr(point, which))
        parts.append(f"{'M' if index == 0 else 'L'}{start:.1f},{y:.1f} H{end:.1f}")
    return " ".join(parts)


def _label_positions(y_soft: float, y_hard: float, top: float,
                     bottom: float) -> tuple[float, float]:
    """Where the soft and hard labels go: at their lines, or pushed apart around their
    middle (the hard one above) when closer than :data:`_LABEL_GAP`, within the frame."""
    if y_soft - y_hard >= _LABEL_GAP:
        return y_soft, y_hard
    middle = (y_soft + y_hard) / 2
    middle = min(max(middle, top + _LABEL_GAP / 2), bottom - _LABEL_GAP / 2)
    return middle + _LABEL_GAP / 2, middle - _LABEL_GAP / 2


def token_chart(entries: Sequence[RequestEntry], *, soft: int, hard: int) -> TokenChart:
    """The chart of ``entries`` (oldest first) with the thresholds each was judged by
    (``soft`` and ``hard``, today's, for an entry that does not say)."""
    right = WIDTH - _RIGHT
    bottom = HEIGHT - _BOTTOM
    limits = [(entry.soft_threshold_tokens or soft, entry.hard_limit_tokens or hard)
              for entry in entries]
    figures = [value for entry in entries for value in (entry.tokens_before, entry.tokens_after)
               if value is not None]
    figures += [value for pair in limits for value in pair]
    top_value = _nice_ceiling(max([hard, soft, *figures, 1]) * 1.1)

    def y_at(tokens: int) -> float:
        return bottom - (bottom - _TOP) * min(tokens, top_value) / top_value

    def y_of(tokens: int | None) -> float | None:
        return None if tokens is None else y_at(tokens)

    count = len(entries)
    span = right - _LEFT
    # One request sits in the middle; more spread from edge to edge.
    xs = ([_LEFT + span / 2] if count == 1
          else [_LEFT + span * index / (count - 1) for index in range(count)])
    points = tuple(
        ChartPoint(number=index + 1, request_id=entry.request_id, x=xs[index],
                   y_before=y_of(entry.tokens_before), y_after=y_of(entry.tokens_after),
                   tokens_before=entry.tokens_before, tokens_after=entry.tokens_after,
                   blocked=entry.blocked and entry.outcome != "invalid",
                   soft=limits[index][0], hard=limits[index][1])
        for index, entry in enumerate(entries)
    )
    step = max(1, -(-count // _X_LABELS))
    x_ticks = tuple(Tick(point.x, str(point.number)) for point in points
                    if (point.number - 1) % step == 0 or point.number == count)
    y_ticks = tuple(Tick(bottom - (bottom - _TOP) * k / _Y_TICKS,
                         _label(top_value * k // _Y_TICKS)) for k in range(_Y_TICKS + 1))
    newest_soft, newest_hard = limits[-1] if limits else (soft, hard)
    soft_path = _steps(points, y_at, "soft", _LEFT, right)
    hard_path = _steps(points, y_at, "hard", _LEFT, right)
    if not points:  # no request yet: today's thresholds across the frame
        soft_path = f"M{_LEFT},{y_at(soft):.1f} H{right}"
        hard_path = f"M{_LEFT},{y_at(hard):.1f} H{right}"
    y_soft_label, y_hard_label = _label_positions(y_at(newest_soft), y_at(newest_hard),
                                                  _TOP, bottom)
    return TokenChart(
        width=WIDTH, height=HEIGHT, left=_LEFT, right=right, top=_TOP, bottom=bottom,
        points=points,
        before_path=_path([(p.x, p.y_before) for p in points]),
        after_path=_path([(p.x, p.y_after) for p in points]),
        soft=newest_soft, hard=newest_hard, soft_path=soft_path, hard_path=hard_path,
        y_soft_label=y_soft_label, y_hard_label=y_hard_label,
        y_ticks=y_ticks, x_ticks=x_ticks,
    )
