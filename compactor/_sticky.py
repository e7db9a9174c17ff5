"""Sticky compaction: reuse a session's compacted prefix while the history only grows.

Everything in ``__all__`` gets re-exported.

An agent resends its whole history on every call. A compactor that recomputes the view each
time slides its window on every request, so the provider's prompt cache misses every time
after the first compaction — and L4 would call a model on every request. A checkpoint records
the compacted view of the first ``covered`` raw messages; a later request whose raw history
starts with those same messages gets the identical compacted prefix plus its new messages,
until the soft threshold is crossed again.

Messages are matched with their ``cache_control`` fields ignored: clients move their cache
breakpoints to the newest messages every turn, and a marker is not content.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policies import CompactionPolicy

from ._blocks import Message
from ._errors import ToolProtocolError
from ._fingerprint import fingerprint, strip_cache_control
from ._l1_truncate import truncate_tool_results
from ._markers import reapply_markers
from ._protocol import Interaction, ProtocolMemo, StagedMemo, validate_tool_protocol
from ._tokens import CachingCounter
from ._view import View

__all__ = ["CompactionCheckpoint"]  # reuse_checkpoint and policy_key are the pipeline's

#: The version of the stored form; bump it when that changes, so older records are ignored
#: (read back as None: compaction starts afresh). 2: the messages' fingerprints, the same in
#: every process, replaced version 1's digests and process-salted fingerprints.
CHECKPOINT_FORMAT = 2


@dataclass(frozen=True)
class CompactionCheckpoint:
    """The compacted view of a session's first ``covered`` raw messages.

    Attributes:
        covered: how many raw messages the view stands for.
        view: the compacted view of those messages, without ``cache_control`` markers.
        fingerprints: the covered raw messages' fingerprints (the same in every process, so
            a checkpoint read back from the store by another replica matches by them).
        policy_key: :func:`policy_key` of the policy it was made with; any other policy
            starts afresh.
        layers: the layers whose effect the view carries.
    """

    covered: int
    view: list[Message]
    fingerprints: tuple[int, ...]
    policy_key: str
    layers: tuple[str, ...]

    @classmethod
    def build(cls, raw: list[Message], view: list[Message], policy_key: str,
              layers: tuple[str, ...], fingerprints: list[int] | None = None,
              ) -> CompactionCheckpoint:
        """A checkpoint covering all of ``raw`` (``fingerprints``: theirs, when known)."""
        prints = tuple(fingerprints) if fingerprints is not None else tuple(
            fingerprint(m) for m in raw)
        return cls(len(raw), [strip_cache_control(m) for m in view], prints, policy_key,
                   tuple(layers))

    @functools.cached_property
    def view_fingerprints(self) -> list[int]:
        """The fingerprints of :attr:`view` (made once per checkpoint object)."""
        return [fingerprint(m) for m in self.view]

    @functools.cached_property
    def _view_tokens(self) -> dict[int, tuple[CachingCounter, list[int]]]:
        return {}

    @functools.cached_property
    def _cut(self) -> dict[int, tuple[CachingCounter, list[Message], list[Message], list[int],
                                      list[int]]]:
        # Per counter, the messages after the covered ones at the last reuse: the client's
        # objects, as L1 left them, and their fingerprints and tokens by that counter (read
        # only: _fresh_view makes new lists).
        return {}

    def view_tokens(self, counter: CachingCounter) -> list[int]:
        """Each message of :attr:`view` as ``counter`` counts it (made once per checkpoint
        object and counter: a warm request does not count its prefix again)."""
        found = self._view_tokens.get(id(counter))
        if found is None or found[0] is not counter:
            found = self._view_tokens[id(counter)] = (counter, [
                counter.count_message(m, p)
                for m, p in zip(self.view, self.view_fingerprints, strict=True)])
        return found[1]

    def matches(self, raw: list[Message], fingerprints: list[int]) -> bool:
        """True when ``raw`` (whose fingerprints are ``fingerprints``) starts with exactly the
        messages this checkpoint covers."""
        if len(raw) < self.covered or self.covered == 0:
            return False
        return tuple(fingerprints[: self.covered]) == self.fingerprints

    @staticmethod
    def conversation_key(messages: object) -> str:
        """A short stable id of the conversation ``messages`` belong to: its first user message
        (``cache_control`` ignored). Parallel conversations of one session — subagents
        sharing their parent's session id — each keep a checkpoint of their own under it."""
        if isinstance(messages, list):
            for message in messages:
                if isinstance(message, dict) and message.get("role") == "user":
                    return f"{fingerprint(message):016x}"
        return "none"

    def to_bytes(self) -> bytes:
        """Serialised for the session store."""
        return json.dumps({"format": CHECKPOINT_FORMAT, "covered": self.covered,
                           "view": self.view, "fingerprints": list(self.fingerprints),
                           "policy_key": self.policy_key, "layers": list(self.layers)},
                          ensure_ascii=False, separators=(",", ":"),
                          ).encode("utf-8", "surrogatepass")

    @classmethod
    def from_bytes(cls, data: bytes) -> CompactionCheckpoint | None:
        """The checkpoint stored in ``data``, or None when it is unreadable or outdated."""
        try:
            raw = json.loads(data.decode("utf-8", "surrogatepass"))
            if raw.get("format") != CHECKPOINT_FORMAT:
                return None
            checkpoint = cls(int(raw["covered"]), list(raw["view"]),
                             tuple(raw["fingerprints"]), str(raw["policy_key"]),
                             tuple(raw["layers"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        if (checkpoint.covered != len(checkpoint.fingerprints)
                or not all(type(p) is int for p in checkpoint.fingerprints)
                or not all(isinstance(m, dict) for m in checkpoint.view)):
            return None
        return checkpoint


#: The version of :func:`policy_key`'s derivation; bump it when the derivation changes, so keys
#: made the old way never match (a checkpoint under an old key: compaction starts afresh).
POLICY_KEY_FORMAT = 2


def policy_key(policy: Any) -> str:
    """A short stable key of the whole policy (a checkpoint is valid for this policy only).

    Derived from every field of the frozen policy dataclass (nested ones such as
    ``ReadToolSpec`` included), so no field can be forgotten: the fields' values as canonical
    JSON, hashed with sha256. Equal policies give equal keys in every process (no ``hash()``,
    no salt); ``p2-<32 hex>``, where ``p2`` is :data:`POLICY_KEY_FORMAT`.

    Raises:
        TypeError: ``policy`` is not a dataclass instance, or a field holds a value that has
            no canonical JSON form (bump the format and teach :func:`_canonical` about it).
    """
    # A caller passes the same policy object request after request: known by identity (the
    # object is held, so its id is not reused), without hashing every field of it.
    known = _KEYS.get(id(policy))
    if known is not None and known[0] is policy:
        return known[1]
    key = _derived_key(policy)
    if len(_KEYS) >= _MAX_KEYS:
        _KEYS.clear()
    _KEYS[id(policy)] = (policy, key)
    return key


#: :func:`policy_key` by the policy's identity (at most :data:`_MAX_KEYS` policies).
_KEYS: dict[int, tuple[Any, str]] = {}
_MAX_KEYS = 256


@functools.lru_cache(maxsize=_MAX_KEYS)
def _derived_key(policy: Any) -> str:
    if not dataclasses.is_dataclass(policy) or isinstance(policy, type):
        raise TypeError(f"policy must be a dataclass instance, got {type(policy).__name__}")
    text = json.dumps(_canonical(policy), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, allow_nan=False)
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return f"p{POLICY_KEY_FORMAT}-{digest[:32]}"


def _canonical(value: Any) -> Any:
    """``value`` as plain JSON data, the same for equal values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: _canonical(getattr(value, f.name)) for f in dataclasses.fields(value)}
        out["__type__"] = type(value).__qualname__
        return out
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        # 1 == 1.0, so both spell 1; NaN and infinities are refused by json.dumps.
        return int(value) if value.is_integer() else value
    if isinstance(value, (tuple, list)):
        return [_canonical(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    raise TypeError(f"policy_key: no canonical form for a {type(value).__name__} value")


def reuse_checkpoint(checkpoint: CompactionCheckpoint, raw: View, policy: CompactionPolicy,
                     key: str, memo: ProtocolMemo | StagedMemo | None = None,
                     ) -> tuple[View, dict[str, Interaction], CompactionCheckpoint] | None:
    """The view of ``raw`` that starts with ``checkpoint``'s compacted prefix, its interaction
    map and the checkpoint; None when the checkpoint was made under another policy or ``raw``
    does not extend the history it covers.

    The new messages follow the prefix with their oversized tool results cut, as L1 always
    would; the client's cache markers go back on the prefix (see ``_markers``). The covered
    prefix was validated when the checkpoint was made, but the view the provider will get is
    validated now.
    """
    messages, prints = raw.messages, raw.fingerprints
    if checkpoint.policy_key != key or not checkpoint.matches(messages, prints):
        return None
    covered = checkpoint.covered
    # Fingerprints and counts are known already: the new messages' from ``raw``, the prefix's
    # from the checkpoint (markers put back change no fingerprint), so a warm request does
    # not fingerprint its whole history again.
    fresh = _fresh_view(checkpoint, raw, policy)
    prefix = reapply_markers(checkpoint.view, checkpoint.view_fingerprints, messages, prints,
                             covered, raw.marked)
    view = View([*prefix, *fresh.messages], raw.counter, raw.reserved,
                [*checkpoint.view_fingerprints, *fresh.fingerprints],
                [*checkpoint.view_tokens(raw.counter), *fresh.tokens], raw.scale, raw.known)
    return view, _validate_extension(view, len(prefix), covered, memo), checkpoint


def _fresh_view(checkpoint: CompactionCheckpoint, raw: View, policy: CompactionPolicy) -> View:
    """The messages after the checkpoint's, their oversized tool results cut as L1 would.

    L1 cuts each result on its own, so the messages that start this request's new part as
    the very objects the previous reuse of this checkpoint started its with (a caller that
    keeps decoded messages across requests hands the same object for the same bytes) are
    taken as they were cut then, by list slices: a warm request cuts only what follows.
    Only the same objects: an equal fingerprint is not enough, as it ignores the
    ``cache_control`` markers a client moves from message to message."""
    covered, counter = checkpoint.covered, raw.counter
    messages = raw.messages[covered:]
    held = checkpoint._cut.get(id(counter))
    if held is None or held[0] is not counter:
        held = (counter, [], [], [], [])
    _, before, before_cut, before_prints, before_tokens = held
    run = list(map(operator.is_, messages, before))  # (C loops, as the slices below)
    try:
        same = run.index(False)
    except ValueError:  # all the same (or nothing before): one scan, not two
        same = len(run)
    cut, _ = truncate_tool_results(
        View(messages[same:], counter, 0, raw.fingerprints[covered + same:],
             raw.tokens[covered + same:], raw.scale, raw.known), {}, policy)
    fresh = View(before_cut[:same] + cut.messages, counter, 0,
                 before_prints[:same] + cut.fingerprints, before_tokens[:same] + cut.tokens,
                 raw.scale, raw.known)
    checkpoint._cut[id(counter)] = (counter, messages, fresh.messages, fresh.fingerprints,
                                    fresh.tokens)
    return fresh


def _validate_extension(view: View, prefix_len: int, covered: int,
                        memo: ProtocolMemo | StagedMemo | None) -> dict[str, Interaction]:
    """Validate a reused prefix plus new messages (from where the memo's walk of the previous
    request's view ended), naming errors by their index in the client's own history."""
    try:
        if memo is None:
            return validate_tool_protocol(view.messages)
        return memo.validate(view.messages, view.fingerprints)
    except ToolProtocolError as error:
        index = error.message_index
        if index >= prefix_len:
            index = index - prefix_len + covered
        raise ToolProtocolError(error.kind, error.tool_use_id, index, error.detail) from None

