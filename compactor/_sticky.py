"""Sticky compaction: reuse a session's compacted prefix while the history only grows.

Recomputing the view on every request would slide its window each time (a prompt cache miss,
and an L4 call, per request). A checkpoint records the compacted view of the first ``covered``
raw messages; a request whose history starts with them (``cache_control`` ignored: clients move
their markers every turn) gets that prefix plus its new messages, until the next crossing.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
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

#: The version of the stored form; bump it when that changes (older records read as None).
CHECKPOINT_FORMAT = 2


@dataclass(frozen=True)
class CompactionCheckpoint:
    """The compacted ``view`` (without ``cache_control`` markers) of a session's first
    ``covered`` raw messages, their ``fingerprints`` (the same in every process), the
    :func:`policy_key` it is valid for and the ``layers`` whose effect it carries."""

    covered: int
    view: list[Message]
    fingerprints: tuple[int, ...]
    policy_key: str
    layers: tuple[str, ...]
    # Per counter: the view's counts, and the messages after the covered ones at the last
    # reuse as they were, cut, and their prints and counts (_fresh_view's).
    _view_tokens: dict[CachingCounter, list[int]] = field(
        default_factory=dict, init=False, repr=False, compare=False)
    _cut: dict[CachingCounter, tuple[list[Message], list[Message], list[int], list[int]]] = (
        field(default_factory=dict, init=False, repr=False, compare=False))

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

    def view_tokens(self, counter: CachingCounter) -> list[int]:
        """Each message of :attr:`view` as ``counter`` counts it (once per counter)."""
        found = self._view_tokens.get(counter)
        if found is None:
            found = self._view_tokens[counter] = [
                counter.count_message(m, p)
                for m, p in zip(self.view, self.view_fingerprints, strict=True)]
        return found

    def matches(self, raw: list[Message], fingerprints: list[int]) -> bool:
        """True when ``raw`` starts with exactly the messages this checkpoint covers."""
        return (0 < self.covered <= len(raw)
                and tuple(fingerprints[: self.covered]) == self.fingerprints)

    @staticmethod
    def conversation_key(messages: object) -> str:
        """A short stable id of the conversation ``messages`` belong to (its first user
        message), so each subagent of a session keeps a checkpoint of its own."""
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


#: The version of :func:`policy_key`'s derivation; bump it when the derivation changes.
POLICY_KEY_FORMAT = 2


def policy_key(policy: Any) -> str:
    """``p2-<32 hex>``: the sha256 of every field of the policy dataclass (nested ones
    included) as canonical JSON, the same in every process; a ``TypeError`` for a value with
    no canonical form. A checkpoint is valid for this policy only."""
    # Known by identity (the object is held, so its id is not reused): no hashing per request.
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
    """The view of ``raw`` that starts with ``checkpoint``'s prefix (the client's markers
    put back), the new messages cut by L1, with its interactions and the checkpoint; None
    under another policy or a history the checkpoint does not start."""
    messages, prints = raw.messages, raw.fingerprints
    if checkpoint.policy_key != key or not checkpoint.matches(messages, prints):
        return None
    covered = checkpoint.covered
    # Fingerprints and counts are known already (markers change no fingerprint).
    fresh = _fresh_view(checkpoint, raw, policy)
    prefix = reapply_markers(checkpoint.view, checkpoint.view_fingerprints, messages, prints,
                             covered, raw.marked)
    view = View([*prefix, *fresh.messages], raw.counter, raw.reserved,
                [*checkpoint.view_fingerprints, *fresh.fingerprints],
                [*checkpoint.view_tokens(raw.counter), *fresh.tokens], raw.scale, raw.known)
    return view, _validate_extension(view, len(prefix), covered, memo), checkpoint


def _fresh_view(checkpoint: CompactionCheckpoint, raw: View, policy: CompactionPolicy) -> View:
    """The messages after the checkpoint's, their oversized tool results cut as L1 would.
    Those that are the very objects the previous reuse started with are taken as cut then
    (not by fingerprint: that ignores ``cache_control``), so a warm request cuts only the rest."""
    covered, counter = checkpoint.covered, raw.counter
    messages = raw.messages[covered:]
    held = checkpoint._cut.get(counter, ([], [], [], []))
    before, before_cut, before_prints, before_tokens = held
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
    checkpoint._cut[counter] = (messages, fresh.messages, fresh.fingerprints, fresh.tokens)
    return fresh


def _validate_extension(view: View, prefix_len: int, covered: int,
                        memo: ProtocolMemo | StagedMemo | None) -> dict[str, Interaction]:
    """Validate a reused prefix plus new messages, naming errors by their index in the
    client's own history."""
    try:
        if memo is None:
            return validate_tool_protocol(view.messages)
        return memo.validate(view.messages, view.fingerprints)
    except ToolProtocolError as error:
        index = error.message_index
        if index >= prefix_len:
            index = index - prefix_len + covered
        raise ToolProtocolError(error.kind, error.tool_use_id, index, error.detail) from None

