"""Calibrated counting: what the provider's own counts teach about the proxy's estimates.

:class:`Calibration` keeps, per session and model, the ratio *provider's count / estimate* of
the views forwarded (the compactor's ``token_scale``), and per tenant and model the windows
refusals taught (:func:`clamp_to_window`); all in bounded process memory, a session's part
shared through the store by :mod:`proxy.calibration.shared`. The rule in operators' words:
docs/how-it-works.md, "Calibration".
"""

from __future__ import annotations

import dataclasses
import operator
import statistics
import struct
import threading
import time
from array import array
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import compress, repeat
from typing import Final

import msgspec
from cachetools import LRUCache, TTLCache

from policies import CompactionPolicy

__all__ = ["FIXED_SHARE", "FLEET_WINDOW", "MAX_FACTOR", "MIN_COUNTED_TOKENS", "MIN_FACTOR",
           "OUTLIER_SPREAD", "SESSION_WINDOW", "WINDOW_MARGIN", "Calibration", "clamp_to_window"]

#: Ratios kept per session (their median judges the newest).
SESSION_WINDOW: Final = 5
#: How far (relative) from the session's median a ratio may lie and still be followed.
OUTLIER_SPREAD: Final = 0.2
#: Ratios kept per model across sessions (a new session's starting factor).
FLEET_WINDOW: Final = 101
#: Bounds of a believable ratio; one outside them is ignored.
MIN_FACTOR: Final = 0.25
MAX_FACTOR: Final = 4.0
#: Views smaller than this say little about the ratio (fixed overheads dominate).
MIN_COUNTED_TOKENS: Final = 64
#: Below a learnt window the soft threshold keeps this fraction of it free.
WINDOW_MARGIN: Final = 0.1
#: A view whose fixed part is at least this share of it teaches the fixed part's ratio; one
#: whose messages are at least the rest teaches the messages' ratio.
FIXED_SHARE: Final = 0.8
#: Sessions whose messages' own counts are remembered (each holds one entry per message of
#: its last view).
MAX_SESSIONS_WITH_MESSAGES: Final = 1_024
#: Forgotten messages tolerated in a session's counts before they are pruned.
PRUNE_SLACK: Final = 256
#: Sessions remembered.
MAX_SESSIONS: Final = 50_000
#: (tenant, model) pairs whose fleet and learnt window are remembered.
MAX_FLEETS: Final = 4_096
#: Seconds a learnt context window is kept (``compaction.learnt_window_ttl_s``).
WINDOW_TTL_S: Final = 600.0
# A snapshot: its format, the size of its JSON head and how many message counts follow
# (each a uint64 fingerprint, then each a float64 count). Format 1 held process-salted
# fingerprints and is not read.
_SNAPSHOT_HEAD: Final = struct.Struct("<BII")
_SNAPSHOT_FORMAT: Final = 2


@dataclass
class _Session:
    """What one (session, model) taught: its whole-view ratios, the ratio of its fixed part
    (``system``, ``tools``, the durable block) and the ratios of its messages."""

    ratios: deque[float] = field(default_factory=partial(deque, maxlen=SESSION_WINDOW))
    reserved: float | None = None
    messages: deque[float] = field(default_factory=partial(deque, maxlen=SESSION_WINDOW))


@dataclass
class _Fleet:
    """What every session of one model taught: recent whole-view, fixed-part and messages'
    ratios (a new session starts from their medians)."""

    ratios: deque[float] = field(default_factory=partial(deque, maxlen=FLEET_WINDOW))
    reserved: deque[float] = field(default_factory=partial(deque, maxlen=FLEET_WINDOW))
    messages: deque[float] = field(default_factory=partial(deque, maxlen=FLEET_WINDOW))


def _followed(ratios: deque[float]) -> float:
    """The newest ratio near the median of ``ratios`` (the median when none is)."""
    median = statistics.median(ratios)
    for ratio in reversed(ratios):
        if abs(ratio - median) <= OUTLIER_SPREAD * median:
            return ratio
    return median


def _fleet_factors(fleet: _Fleet | None) -> tuple[float, float]:
    """The fixed part's and the messages' factors of a session that taught nothing yet: the
    fleet's medians, the whole-view median standing in for a missing one, else 1."""
    whole = statistics.median(fleet.ratios) if fleet and fleet.ratios else 1.0
    reserved = statistics.median(fleet.reserved) if fleet and fleet.reserved else whole
    messages = statistics.median(fleet.messages) if fleet and fleet.messages else whole
    return reserved, messages


def _tenant(session_key: str) -> str:
    """The tenant of a store key (:func:`proxy.http.tenants.scoped_key`): what precedes its
    ``/`` (a session id never holds one), else ``none``."""
    tenant, slash, _ = session_key.partition("/")
    return tenant if slash else "none"


class Calibration:
    """Correction factors per (session, model) and per (tenant, model), and learnt context
    windows per (tenant, model). Thread-safe (one lock).

    The fixed part (``system``, ``tools``, the durable block) and the messages tokenize
    differently, and compaction changes their mix: each has its own ratio (one whole-view ratio
    serves both until a mostly-fixed view taught the fixed part's), and each message keeps the
    count the provider gave it, so a compacted view of known messages is estimated right.
    """

    def __init__(self, *, max_sessions: int = MAX_SESSIONS, window_ttl_s: float = WINDOW_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._sessions: LRUCache[tuple[str, str], _Session] = LRUCache(max_sessions)
        # (tenant, model) -> what its sessions taught; least recently used go.
        self._fleet: LRUCache[tuple[str, str], _Fleet] = LRUCache(MAX_FLEETS)
        # A session's messages' counts by fingerprint: a count, once set, never changes (new
        # messages are added; the mapping is replaced when pruned).
        self._known: LRUCache[tuple[str, str], dict[int, float]] = LRUCache(
            min(max_sessions, MAX_SESSIONS_WITH_MESSAGES))
        # (tenant, model) -> the window learnt, kept window_ttl_s.
        self._windows: TTLCache[tuple[str, str], int] = TTLCache(MAX_FLEETS, window_ttl_s,
                                                                 timer=clock)
        self._lock = threading.Lock()

    def factors(self, session_key: str, model: str) -> tuple[float, float]:
        """The provider's tokens per counted token of the fixed part and of the messages, for
        this session and model. What the session has not taught yet comes from its tenant's
        fleet of that model (the medians over those sessions' recent ratios), else 1."""
        with self._lock:
            fleet = self._fleet.get((_tenant(session_key), model))
            session = self._sessions.get((session_key, model))
            if session is None or not session.ratios:
                return _fleet_factors(fleet)
            # The fleet's medians (each a sort of its window) only where the session needs one.
            if session.messages:
                messages = _followed(session.messages)
            elif session.reserved is not None and fleet and fleet.messages:
                messages = statistics.median(fleet.messages)
            else:
                messages = _followed(session.ratios)
            return (session.reserved if session.reserved is not None else messages), messages

    def factor(self, session_key: str, model: str) -> float:
        """The messages' factor (see :meth:`factors`)."""
        return self.factors(session_key, model)[1]

    def observe(self, session_key: str, model: str, counted: int, provider: int,
                reserved: int = 0, fingerprints: Sequence[int] = (),
                tokens: Sequence[int] = ()) -> float | None:
        """Learn from one view (``counted`` by the proxy, ``reserved`` of it the fixed part;
        ``provider`` by the provider; its messages' fingerprints and counted ``tokens``). The
        whole-view ratio when kept, ``None`` when ignored (a tiny view, an unbelievable ratio).
        A view counted above the tenant's learnt window forgets that window."""
        if provider > 0:
            self._widen_window(session_key, model, provider)
        if counted < MIN_COUNTED_TOKENS or provider <= 0:
            return None
        ratio = provider / counted
        if not MIN_FACTOR <= ratio <= MAX_FACTOR:
            return None
        reserved = max(0, min(reserved, counted))
        key = (session_key, model)
        with self._lock:
            session = self._sessions.setdefault(key, _Session())
            fleet = self._fleet.setdefault((_tenant(session_key), model), _Fleet())
            session.ratios.append(ratio)
            fleet.ratios.append(ratio)
            if reserved >= FIXED_SHARE * counted:
                session.reserved = ratio
                fleet.reserved.append(ratio)
            fixed = (session.reserved if session.reserved is not None else ratio) * reserved
            if fingerprints:
                self._learn_messages(key, session, fleet, fingerprints, tokens,
                                     provider - fixed)
            elif counted - reserved >= (1 - FIXED_SHARE) * counted:
                part = (provider - fixed) / (counted - reserved)
                if MIN_FACTOR <= part <= MAX_FACTOR:
                    session.messages.append(part)
                    fleet.messages.append(part)
        return ratio

    def _learn_messages(self, key: tuple[str, str], session: _Session, fleet: _Fleet,
                        fingerprints: Sequence[int], tokens: Sequence[int],
                        provider_messages: float) -> None:
        known = self._known.setdefault(key, {})
        if len(fingerprints) != len(tokens):
            raise ValueError(f"{len(fingerprints)} fingerprints for {len(tokens)} counts")
        # C loops only: a warm view is its previous view (every count known) plus a message
        # or two, and this runs on every answer.
        values = list(map(known.get, fingerprints))
        counted = float(sum(tokens))
        unknown: list[tuple[int, int]] = []
        if None in values:
            missing = list(map(operator.is_, values, repeat(None)))
            unknown = list(compress(zip(fingerprints, tokens, strict=True), missing))
            values = list(compress(values, map(operator.not_, missing)))
        known_sum = float(sum(values))  # type: ignore[arg-type]  # (the Nones left out)
        unknown_counted = float(sum(count for _, count in unknown))
        # The messages' factor (for messages whose count is not known) is the ratio over all
        # of the view's messages: an average over every kind of content, steadier than the
        # ratio of the few messages new in this view.
        if counted >= MIN_COUNTED_TOKENS:
            whole = provider_messages / counted
            if MIN_FACTOR <= whole <= MAX_FACTOR:
                session.messages.append(whole)
                fleet.messages.append(whole)
        if unknown_counted >= MIN_COUNTED_TOKENS:
            part = (provider_messages - known_sum) / unknown_counted
            if MIN_FACTOR <= part <= MAX_FACTOR:
                known.update((print_, count * part) for print_, count in unknown)
        if len(known) > 2 * len(fingerprints) + PRUNE_SLACK:
            # Messages that left the views (compaction) are forgotten now and then, not on
            # every answer: a warm request's bookkeeping stays one pass over its view.
            self._known[key] = {p: known[p] for p in fingerprints if p in known}

    def known(self, session_key: str, model: str) -> Mapping[int, float]:
        """The provider's own count of each message of the session's last view whose count
        it taught, by fingerprint (empty when none)."""
        with self._lock:
            return self._known.get((session_key, model)) or {}

    async def saved(self, session_key: str) -> None:
        """Return once what ``session_key`` taught is where every process serving it reads
        it: at once here; :class:`~proxy.calibration.shared.SharedCalibration` waits."""
        del session_key

    def holds(self, session_key: str, model: str) -> bool:
        """Whether ``(session_key, model)`` taught something this process still holds."""
        with self._lock:
            return (session_key, model) in self._sessions

    def snapshot(self, session_key: str, model: str) -> bytes | None:
        """What ``(session_key, model)`` taught, as bytes for :meth:`restore` (``None``:
        nothing yet)."""
        key = (session_key, model)
        with self._lock:
            session = self._sessions.get(key)
            if session is None:
                return None
            known = self._known.get(key) or {}
            # (JSON by msgspec, one C call each way: a replica of an earlier version reads it
            # with json.loads, as this one reads theirs)
            head = msgspec.json.encode({"ratios": list(session.ratios),
                                        "reserved": session.reserved,
                                        "messages": list(session.messages)})
            prints = array("Q", known.keys())
            counts = array("d", known.values())
        return b"".join((_SNAPSHOT_HEAD.pack(_SNAPSHOT_FORMAT, len(head), len(prints)), head,
                         prints.tobytes(), counts.tobytes()))

    def restore(self, session_key: str, model: str, data: bytes) -> bool:
        """Replace what ``(session_key, model)`` taught by a :meth:`snapshot` (made by any
        process); ``False`` (nothing changed) when ``data`` is not one (or is one of an
        older format)."""
        try:
            form, head_size, count = _SNAPSHOT_HEAD.unpack_from(data)
            start = _SNAPSHOT_HEAD.size
            head = msgspec.json.decode(data[start:start + head_size])
            start += head_size
            prints = array("Q", data[start:start + 8 * count])
            counts = array("d", data[start + 8 * count:start + 16 * count])
            if form != _SNAPSHOT_FORMAT or len(prints) != count or len(counts) != count:
                return False
            session = _Session()
            session.ratios.extend(float(r) for r in head["ratios"])
            session.messages.extend(float(r) for r in head["messages"])
            reserved = head["reserved"]
            session.reserved = None if reserved is None else float(reserved)
        except (struct.error, msgspec.DecodeError, ValueError, KeyError, TypeError):
            return False
        key = (session_key, model)
        with self._lock:
            self._sessions[key] = session
            self._known[key] = dict(zip(prints, counts, strict=True))
        return True

    def window(self, session_key: str, model: str) -> int | None:
        """The context window the provider said ``model`` has for the session's tenant, while
        that is recent (``window_ttl_s``)."""
        with self._lock:
            return self._windows.get((_tenant(session_key), model))

    def learn_window(self, session_key: str, model: str, maximum: int) -> None:
        """Remember ``maximum`` (from ``prompt is too long: N tokens > M maximum``) for the
        session's tenant and ``model``; the smallest one heard while it is kept wins."""
        if maximum < 1:
            return
        key = (_tenant(session_key), model)
        with self._lock:
            known = self._windows.get(key)
            if known is None or maximum <= known:
                self._windows[key] = maximum

    def _widen_window(self, session_key: str, model: str, provider: int) -> None:
        key = (_tenant(session_key), model)
        with self._lock:
            found = self._windows.get(key)
            if found is not None and provider > found:
                del self._windows[key]


def clamp_to_window(policy: CompactionPolicy, window: int | None) -> CompactionPolicy:
    """``policy`` with its thresholds below a provider window: the hard limit at most the
    window, the soft threshold at most the window less :data:`WINDOW_MARGIN` of it. The same
    policy when it already fits (so its checkpoints keep their key)."""
    if window is None:
        return policy
    hard = min(policy.hard_limit_tokens, window)
    soft = min(policy.soft_threshold_tokens, max(1, int(window * (1 - WINDOW_MARGIN))))
    if soft >= hard:
        soft = max(1, hard - 1)
    if hard == policy.hard_limit_tokens and soft == policy.soft_threshold_tokens:
        return policy
    return dataclasses.replace(policy, soft_threshold_tokens=soft, hard_limit_tokens=hard)
