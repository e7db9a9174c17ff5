"""The tool-call protocol: every use answered by exactly one result, in the right place.

Client calls (``tool_use``) are answered by ``tool_result`` blocks that open the very next
message, a user message; server calls (``server_tool_use``, ``mcp_tool_use``) by a
``*_tool_result`` after them in the same assistant message (a use may stand alone:
``pause_turn``). Other roles are transparent. The returned map lets layers remove pairs whole.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Final, Literal, cast

from cachetools import LRUCache

from ._blocks import CLIENT_RESULT, CLIENT_USE, SERVER_USES, Message, blocks_of, is_server_result
from ._errors import MessageShapeError, ProtocolErrorKind, ToolProtocolError

__all__ = ["Interaction", "ProtocolMemo", "validate_tool_protocol"]

InteractionKind = Literal["client", "server"]


@dataclass(frozen=True)
class Interaction:
    """One tool call and where its answer is (``result_index`` None: a server use without
    its result yet). ``tool_input`` is the caller's object: read-only."""

    tool_use_id: str
    kind: InteractionKind
    use_index: int
    result_index: int | None
    name: str
    tool_input: Any
    is_error: bool


_USE_INDEX: Final = attrgetter("use_index")
_TOOL_USE_ID: Final = attrgetter("tool_use_id")


def check_shape(messages: object) -> list[Message]:
    """``messages``, checked to be a list of message objects with valid content (else a
    :class:`MessageShapeError` naming the first place that is not)."""
    if not isinstance(messages, list):
        raise MessageShapeError("messages", "must be a list")
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise MessageShapeError(f"messages.{index}", "must be an object")
        content = message.get("content")
        if isinstance(content, list):
            for position, block in enumerate(content):
                if not isinstance(block, dict):
                    raise MessageShapeError(f"messages.{index}.content.{position}",
                                            "must be an object")
        elif not isinstance(content, str):
            raise MessageShapeError(f"messages.{index}.content",
                                    "must be a string or a list of blocks")
    return messages


def _id_of(block: dict[str, Any], field: str, index: int) -> str:
    value = block.get(field)
    if not isinstance(value, str) or not value:
        raise MessageShapeError(f"messages.{index}", f"{block.get('type')} block has no {field}")
    return value


def validate_tool_protocol(messages: list[Message]) -> dict[str, Interaction]:
    """``{tool_use_id: Interaction}`` of ``messages`` in order of the uses; raises
    :class:`ToolProtocolError` or :class:`MessageShapeError` (an absent id too)."""
    check_shape(messages)
    walk = _Walk(_Places.of(messages))
    walk.walk(messages, 0)
    return walk.finish()


class _Broken(Exception):
    """A resumed walk met a violation: the whole walk is run to name it."""


@dataclass(frozen=True)
class _Places:
    """Where every use and result is: what names a violation's kind (an unanswered use
    answered later is ``not_adjacent``, not ``missing``)."""

    use_at: dict[str, int]
    results_at: dict[str, list[int]]

    @classmethod
    def of(cls, messages: list[Message], start: int = 0) -> _Places:
        """The places in ``messages[start:]`` (every id checked to be present)."""
        use_at: dict[str, int] = {}
        results_at: dict[str, list[int]] = {}
        for index in range(start, len(messages)):
            for block in blocks_of(messages[index]):
                block_type = block.get("type")
                if block_type == CLIENT_USE or block_type in SERVER_USES:
                    use_at.setdefault(_id_of(block, "id", index), index)
                elif block_type == CLIENT_RESULT:
                    results_at.setdefault(_id_of(block, "tool_use_id", index), []).append(index)
        return cls(use_at, results_at)


class _Walk:
    """The protocol checked message by message, resumable over messages that extend it
    (:class:`ProtocolMemo`). Without ``places`` a violation raises :class:`_Broken`: a
    resumed walk hands over to the whole walk, which names it."""

    __slots__ = ("interactions", "open_from", "open_uses", "places", "seen_use_ids")

    def __init__(self, places: _Places | None) -> None:
        self.places = places
        self.interactions: dict[str, Interaction] = {}
        self.open_uses: dict[str, dict[str, Any]] = {}  # client uses waiting for the next message
        self.open_from = -1
        self.seen_use_ids: set[str] = set()

    def resumed(self) -> _Walk:
        """A copy to walk on (this one stays as it is), violations raising :class:`_Broken`."""
        walk = _Walk(None)
        walk.interactions = dict(self.interactions)
        walk.open_uses = dict(self.open_uses)
        walk.open_from = self.open_from
        walk.seen_use_ids = set(self.seen_use_ids)
        return walk

    def _places(self) -> _Places:
        if self.places is None:
            raise _Broken
        return self.places

    def _close_open(self) -> None:
        for tool_use_id in self.open_uses:
            later = [i for i in self._places().results_at.get(tool_use_id, ())
                     if i > self.open_from]
            kind: ProtocolErrorKind = "not_adjacent" if later else "missing"
            raise ToolProtocolError(kind, tool_use_id, self.open_from,
                                    "tool_use has no tool_result in the next message")

    def finish(self) -> dict[str, Interaction]:
        """The map, once every use before the end is answered."""
        self._close_open()
        # (Each kept by its own id: sorted and keyed again in C, not a key function per use.)
        ordered = sorted(self.interactions.values(), key=_USE_INDEX)
        return dict(zip(map(_TOOL_USE_ID, ordered), ordered, strict=True))

    def walk(self, messages: list[Message], start: int) -> None:
        """Walk on over ``messages[start:]``."""
        for index in range(start, len(messages)):
            message = messages[index]
            role = message.get("role")
            if role == "user":
                self._user(index, blocks_of(message))
            elif role == "assistant":
                self._assistant(index, blocks_of(message))
            # any other role is transparent for adjacency

    def _user(self, index: int, blocks: list[dict[str, Any]]) -> None:
        interactions, open_uses = self.interactions, self.open_uses
        answered_here: dict[str, bool] = {}  # id -> is_error
        seen_other = False
        for block in blocks:
            if block.get("type") != CLIENT_RESULT:
                seen_other = True
                continue
            tool_use_id = _id_of(block, "tool_use_id", index)
            if tool_use_id in answered_here or tool_use_id in interactions:
                raise ToolProtocolError("duplicate", tool_use_id, index,
                                        "tool_use_id answered more than once")
            if tool_use_id not in open_uses:
                use_index = self._places().use_at.get(tool_use_id)
                if use_index is None:
                    raise ToolProtocolError("unknown", tool_use_id, index,
                                            "no tool_use carries this id")
                if use_index > index:
                    raise ToolProtocolError("out_of_order", tool_use_id, index,
                                            "tool_result comes before its tool_use")
                raise ToolProtocolError("not_adjacent", tool_use_id, index,
                                        "tool_result is not in the message right after "
                                        "its tool_use")
            if seen_other:
                raise ToolProtocolError("out_of_order", tool_use_id, index,
                                        "tool_result blocks must come first in their message")
            answered_here[tool_use_id] = block.get("is_error") is True
        for tool_use_id in [i for i in open_uses if i in answered_here]:
            use = open_uses.pop(tool_use_id)
            interactions[tool_use_id] = Interaction(
                tool_use_id, "client", self.open_from, index, str(use.get("name", "")),
                use.get("input"), answered_here[tool_use_id])
        self._close_open()

    def _assistant(self, index: int, blocks: list[dict[str, Any]]) -> None:
        self._close_open()
        interactions, seen_use_ids = self.interactions, self.seen_use_ids
        server_open: dict[str, dict[str, Any]] = {}
        for block in blocks:
            block_type = block.get("type")
            if block_type == CLIENT_USE or block_type in SERVER_USES:
                tool_use_id = _id_of(block, "id", index)
                if tool_use_id in seen_use_ids:
                    raise ToolProtocolError("duplicate", tool_use_id, index,
                                            "tool_use id is used more than once")
                seen_use_ids.add(tool_use_id)
                if block_type == CLIENT_USE:
                    self.open_uses[tool_use_id] = block
                else:
                    server_open[tool_use_id] = block
            elif is_server_result(block_type):
                tool_use_id = _id_of(block, "tool_use_id", index)
                server_use = server_open.pop(tool_use_id, None)
                if server_use is None:
                    if tool_use_id in interactions:
                        raise ToolProtocolError("duplicate", tool_use_id, index,
                                                "server tool use answered more than once")
                    later = self._places().use_at.get(tool_use_id)
                    if later is not None and (later > index or tool_use_id not in seen_use_ids):
                        raise ToolProtocolError("out_of_order", tool_use_id, index,
                                                f"{block_type} comes before its use")
                    if later is not None:
                        raise ToolProtocolError("not_adjacent", tool_use_id, index,
                                                f"{block_type} is not in the message of its use")
                    raise ToolProtocolError("unknown", tool_use_id, index,
                                            "no server tool use carries this id")
                interactions[tool_use_id] = Interaction(
                    tool_use_id, "server", index, index, str(server_use.get("name", "")),
                    server_use.get("input"), block.get("is_error") is True)
            elif block_type == CLIENT_RESULT:
                raise ToolProtocolError("out_of_order", _id_of(block, "tool_use_id", index),
                                        index, "tool_result inside an assistant message")
        for tool_use_id, lone in server_open.items():
            # A server use without its result (a paused turn) stands alone as a unit.
            interactions[tool_use_id] = Interaction(
                tool_use_id, "server", index, None, str(lone.get("name", "")), lone.get("input"),
                False)
        self.open_from = index


#: A new walk to keep: its messages' fingerprints, the walk, the kept walk it went on from.
_Walked = tuple[list[int], "_Walk", "tuple[list[int], _Walk] | None"]

#: How many messages' walks a :class:`ProtocolMemo` holds by default.
DEFAULT_MEMO_MESSAGES: Final = 1_000_000


class ProtocolMemo:
    """Walks of the tool-call protocol kept by their messages' fingerprints, so a history
    that extends one validated before is checked from where that walk ended (a violation is
    named as :func:`validate_tool_protocol` names it). ``per_start`` walks per first message,
    least recently used dropped beyond ``max_messages`` messages. Thread-safe."""

    def __init__(self, max_messages: int = DEFAULT_MEMO_MESSAGES, *, per_start: int = 2) -> None:
        if max_messages < 1 or per_start < 1:
            raise ValueError("max_messages and per_start must be >= 1")
        self.max_messages = max_messages
        self.per_start = per_start
        # first message's fingerprint -> [(fingerprints walked, the walk)], sized in messages
        self._walks: LRUCache[int, list[tuple[list[int], _Walk]]] = LRUCache(
            max_messages, getsizeof=_walked)
        self._lock = threading.Lock()

    def validate(self, messages: list[Message],
                 fingerprints: Sequence[int]) -> dict[str, Interaction]:
        """:func:`validate_tool_protocol` of ``messages`` (``fingerprints``: theirs, one per
        message), from a kept walk where one covers their start."""
        interactions, walked = self._validate(messages, fingerprints)
        if walked is not None:
            with self._lock:
                self._keep(*walked)
        return interactions

    def __len__(self) -> int:
        """Messages whose walks are held."""
        return int(self._walks.currsize)

    def staged(self) -> StagedMemo:
        """A memo for one request: it reads the kept walks and keeps its own new ones aside
        until :meth:`StagedMemo.commit`, so a request that is refused leaves nothing here."""
        return StagedMemo(self)

    def _validate(self, messages: list[Message], fingerprints: Sequence[int]
                  ) -> tuple[dict[str, Interaction], _Walked | None]:
        """The interactions, and the new walk to keep (None: nothing new to keep)."""
        if len(fingerprints) != len(messages):
            raise ValueError(f"{len(fingerprints)} fingerprints for {len(messages)} messages")
        if not messages:
            return validate_tool_protocol(messages), None
        prints = list(fingerprints)
        with self._lock:
            kept = self._walks.get(prints[0])
            # The longest kept walk that these messages start with.
            base = max((entry for entry in kept or () if prints[:len(entry[0])] == entry[0]),
                       key=lambda entry: len(entry[0]), default=None)
            if base is not None and len(base[0]) == len(prints):
                # The very history walked before (a retry): it becomes the latest.
                entries = cast("list[tuple[list[int], _Walk]]", kept)
                entries.remove(base)
                entries.insert(0, base)
                return base[1].finish(), None
        if base is None:
            walk, start = _Walk(None), 0
        else:
            walk, start = base[1].resumed(), len(base[0])
        try:
            check_shape(messages[start:])
            walk.walk(messages, start)
            interactions = walk.finish()
        except (_Broken, ToolProtocolError, MessageShapeError):
            # names the violation as it always does
            return validate_tool_protocol(messages), None
        return interactions, (prints, walk, base)

    def _keep(self, prints: list[int], walk: _Walk,
              base: tuple[list[int], _Walk] | None) -> None:
        entries = self._walks.pop(prints[0], [])
        if base is not None and any(entry is base for entry in entries):
            # the new walk goes on from it (unless it was dropped meanwhile)
            entries = [entry for entry in entries if entry is not base]
        entries.insert(0, (prints, walk))
        del entries[self.per_start:]
        if _walked(entries) <= self.max_messages:  # (else it would go at once)
            self._walks[prints[0]] = entries


def _walked(entries: list[tuple[list[int], _Walk]]) -> int:
    return sum(len(entry[0]) for entry in entries)


class StagedMemo:
    """:meth:`ProtocolMemo.staged`: the kept walks read, new ones kept aside."""

    def __init__(self, shared: ProtocolMemo) -> None:
        self.shared = shared
        self._walked: list[_Walked] = []

    def validate(self, messages: list[Message],
                 fingerprints: Sequence[int]) -> dict[str, Interaction]:
        """:meth:`ProtocolMemo.validate`, the new walk kept aside."""
        interactions, walked = self.shared._validate(messages, fingerprints)
        if walked is not None:
            self._walked.append(walked)
        return interactions

    def commit(self) -> None:
        """Keep the walks made here in the shared memo (the request was accepted)."""
        walked, self._walked = self._walked, []
        with self.shared._lock:
            for one in walked:
                self.shared._keep(*one)
