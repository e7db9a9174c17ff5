"""Render the durable context state as one text block and append it to ``system``.

The text is a pure function of the state and the resolutions (no clock, no dict order): any
byte that changed between turns would invalidate the prompt cache. Free text is quoted so a
hostile fact cannot forge a line or a tag; excerpts are never rendered. Layout: docs/admin.md.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from ._resolver import SourceResolution
from ._state import DurableContextState

__all__ = ["render_durable_context", "append_to_system"]

OPEN_TAG = "<durable_context>"
CLOSE_TAG = "</durable_context>"
HEADING = (
    "Operator-maintained durable context (set through the admin API, not a summary of this "
    "conversation); each item names its source and whether that source was verified."
)

# Categories escaped on top of what JSON escapes: controls (incl. DEL and C1), line and
# paragraph separators, invisible format characters (bidi overrides, zero-width).
_ESCAPED_CATEGORIES = frozenset({"Cc", "Zl", "Zp", "Cf"})
_ESCAPED_CHARS = frozenset("<>")
# A conflict key that is a plain token is shown bare (``conflict_winner=deploy-target``);
# anything else is quoted like every other free-text value.
_BARE_TOKEN_RE = re.compile(r"[A-Za-z0-9_.:/@+-]+", re.ASCII)


def _quote(text: str) -> str:
    """A one-line, structure-proof quoted form of ``text``."""
    literal = json.dumps(text, ensure_ascii=False)
    # isprintable() is False for every category escaped below: most values skip the loop.
    if literal.isprintable() and "<" not in literal and ">" not in literal:
        return literal
    out: list[str] = []
    for ch in literal:
        if ch in _ESCAPED_CHARS or unicodedata.category(ch) in _ESCAPED_CATEGORIES:
            code = ord(ch)
            if code > 0xFFFF:  # JSON spells astral characters as a surrogate pair
                code -= 0x10000
                out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
            else:
                out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


def _utc(value: datetime) -> str:
    """ISO 8601 in UTC with a ``Z`` suffix; the same instant always gives the same text."""
    return value.astimezone(UTC).replace(tzinfo=None).isoformat() + "Z"


def _status(resolution: SourceResolution) -> str:
    if resolution.status == "available":
        return f"source_status=available evidence_sha256={resolution.evidence_sha256}"
    return f"source_status={resolution.status} evidence_unavailable=true"


def _index_resolutions(
    state: DurableContextState, source_resolutions: Sequence[SourceResolution]
) -> dict[str, SourceResolution]:
    """Map pointer -> resolution, requiring exactly one resolution per state pointer."""
    by_pointer: dict[str, SourceResolution] = {}
    for index, resolution in enumerate(source_resolutions):
        if not isinstance(resolution, SourceResolution):
            raise ValueError(
                f"source_resolutions[{index}]: must be a SourceResolution, "
                f"got {type(resolution).__name__}"
            )
        if resolution.pointer in by_pointer:
            raise ValueError(
                f"source_resolutions[{index}]: duplicate resolution for {resolution.pointer!r}"
            )
        by_pointer[resolution.pointer] = resolution
    wanted = state.source_pointers()
    missing = [p for p in wanted if p not in by_pointer]
    if missing:
        raise ValueError(f"source_resolutions: no resolution for pointer {missing[0]!r}")
    if len(by_pointer) != len(wanted):
        wanted_set = set(wanted)
        extra = next(p for p in by_pointer if p not in wanted_set)
        raise ValueError(
            f"source_resolutions: resolution for {extra!r}, which the state does not reference"
        )
    return by_pointer


def render_durable_context(
    state: DurableContextState, source_resolutions: Sequence[SourceResolution] = ()
) -> str:
    """The delimited block of ``state`` (``""`` when empty) with each source's status;
    ``source_resolutions`` holds exactly one per distinct pointer of the state, in any order
    (else a ``ValueError``)."""
    if not isinstance(state, DurableContextState):
        raise TypeError(f"state must be a DurableContextState, got {type(state).__name__}")
    resolutions = _index_resolutions(state, source_resolutions)
    if state.is_empty:
        return ""
    lines = [OPEN_TAG, HEADING]
    if state.facts:
        lines.append("facts:")
        for fact in state.facts:
            lines.append(
                f"- fact_id={_quote(fact.fact_id)} content={_quote(fact.content)} "
                f"source_pointer={_quote(fact.source_pointer)} "
                f"last_confirmed_at={_utc(fact.last_confirmed_at)} "
                f"{_status(resolutions[fact.source_pointer])}"
            )
    if state.pending_items:
        lines.append("pending_items:")
        for item in state.pending_items:
            lines.append(
                f"- item_id={_quote(item.item_id)} description={_quote(item.description)} "
                f"source_pointer={_quote(item.source_pointer)} "
                f"last_confirmed_at={_utc(item.last_confirmed_at)} status={item.status} "
                f"{_status(resolutions[item.source_pointer])}"
            )
    if state.retrieval_evidence:
        lines.append("retrieval_evidence:")
        for ev in state.retrieval_evidence:
            key = ev.conflict_key
            conflict = ("conflict=none" if key is None else "conflict_winner="
                        + (key if _BARE_TOKEN_RE.fullmatch(key) else _quote(key)))
            lines.append(
                f"- memory_id={_quote(ev.memory_id)} source_id={_quote(ev.source_id)} "
                f"source_type={_quote(ev.source_type)} "
                f"source_title={_quote(ev.source_title)} "
                f"captured_at={_utc(ev.captured_at)} score={ev.score:.3f} "
                f"rank={ev.source_rank} {conflict} {_status(resolutions[ev.source_id])}"
            )
    lines.append(CLOSE_TAG)
    return "\n".join(lines)


def append_to_system(system: object, text: str) -> list[Any]:
    """A new list: ``system`` (None, a string or a list of blocks, left untouched), then
    ``text`` (non-empty: the API refuses empty blocks) as one more text block, no
    ``cache_control`` added."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a string, got {type(text).__name__}")
    if not text:
        raise ValueError("text must not be empty (an empty state renders to ''; skip it)")
    block: dict[str, Any] = {"type": "text", "text": text}
    if system is None:
        return [block]
    if isinstance(system, str):
        return [{"type": "text", "text": system}, block] if system else [block]
    if isinstance(system, list):
        return [*system, block]
    if isinstance(system, Mapping):
        raise TypeError("system must be a string or a list of blocks, got a single object")
    raise TypeError(f"system must be None, a string or a list of blocks, "
                    f"got {type(system).__name__}")
