"""The client's ``cache_control`` markers, put back on a reused compacted prefix.

A checkpoint keeps its view without markers (clients move them every turn). On reuse, every
marker the client put *now* on a block that survived goes back on that block, in the same key
position, so a retried request is forwarded byte-identical and an older breakpoint still reads
the cache. A block is found as its unchanged message (by fingerprint, k-th from the end), by its
tool id, or by fingerprint inside the view message holding the same ids. No marker is added.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._blocks import CLIENT_RESULT, Block, Message
from ._fingerprint import fingerprint

MARKER = "cache_control"


def _block_marked(block: Block) -> bool:
    if MARKER in block:
        return True
    inner = block.get("content")
    return block.get("type") == CLIENT_RESULT and isinstance(inner, list) and any(
        isinstance(b, dict) and MARKER in b for b in inner)


def _marked_blocks(message: Message) -> list[int]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [j for j, block in enumerate(content) if _block_marked(block)]


def has_markers(message: Message) -> bool:
    """Whether any block of ``message`` carries a ``cache_control`` marker."""
    return bool(_marked_blocks(message))


def _id_key(block: Block) -> tuple[str, str] | None:
    for field in ("id", "tool_use_id"):
        value = block.get(field)
        if isinstance(value, str):
            return field, value
    return None


def _merge(raw: Any, view: Any) -> Any:
    """``view`` with the markers of ``raw`` at every depth, keys in ``raw``'s order."""
    if isinstance(raw, dict) and isinstance(view, dict):
        out = {k: (v if k == MARKER else _merge(v, view[k]))
               for k, v in raw.items() if k == MARKER or k in view}
        out.update((k, v) for k, v in view.items() if k not in out)
        return out
    if isinstance(raw, list) and isinstance(view, list) and len(raw) == len(view):
        return [_merge(r, v) for r, v in zip(raw, view, strict=True)]
    return view


def reapply_markers(view: list[Message], view_fingerprints: Sequence[int], raw: list[Message],
                    raw_fingerprints: Sequence[int], covered: int,
                    candidates: Sequence[int] | None = None) -> list[Message]:
    """``view`` (the compacted form of ``raw[:covered]``, without markers) with the markers
    those raw messages carry on the blocks that survived; ``view`` itself when they carry
    none. ``candidates``: the only indexes that may carry markers, when known."""
    search = range(covered) if candidates is None else (i for i in candidates if i < covered)
    marked = [i for i in search if _marked_blocks(raw[i])]
    if not marked:
        return view
    out = list(view)
    edited: list[int] = []
    for i in marked:
        value = raw_fingerprints[i]
        nth = raw_fingerprints[i + 1:covered].count(value)
        places = [j for j, p in enumerate(view_fingerprints) if p == value]
        if nth < len(places):
            # unchanged: the client's own message, markers where it put them
            out[places[-1 - nth]] = raw[i]
        else:
            edited.append(i)
    if edited:
        _merge_into_edited(out, raw, edited)
    return out


def _merge_into_edited(out: list[Message], raw: list[Message], edited: list[int]) -> None:
    """Put the markers of the marked blocks of ``raw[i]`` (``i`` in ``edited``: messages a
    layer changed) onto their blocks in ``out``, in place of those messages."""
    where = {key: (j, k) for j, message in enumerate(out)
             if isinstance(message.get("content"), list)
             for k, block in enumerate(message["content"]) if (key := _id_key(block)) is not None}
    for i in edited:
        blocks = raw[i]["content"]
        homes = {where[key][0] for b in blocks if (key := _id_key(b)) is not None and key in where}
        for position in _marked_blocks(raw[i]):
            block = blocks[position]
            key = _id_key(block)
            target: tuple[int, int] | None = where.get(key) if key is not None else None
            if target is None and key is None and len(homes) == 1:
                target = _same_block(out, next(iter(homes)), block)
            if target is not None:
                j, k = target
                content = list(out[j]["content"])
                content[k] = _merge(block, content[k])
                out[j] = {**out[j], "content": content}


def _same_block(out: list[Message], j: int, block: Block) -> tuple[int, int] | None:
    wanted = fingerprint(block)
    for k, candidate in enumerate(out[j]["content"]):
        if (_id_key(candidate) is None and MARKER not in candidate
                and fingerprint(candidate) == wanted):
            return j, k
    return None
