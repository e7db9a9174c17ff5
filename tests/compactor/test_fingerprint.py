"""Content fingerprints (:func:`compactor._fingerprint.fingerprint`): equal for the same
content with its ``cache_control`` markers moved or gone, different for different content
(types and key order included), for any JSON value, lone surrogates included."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import compactor._fingerprint as fingerprints
from compactor import CompactionCheckpoint
from compactor._fingerprint import (
    fingerprint,
    stable_digest,
    stable_digest_of,
    strip_cache_control,
)

_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([1.0, 0.5]),
                     st.text(max_size=4), st.sampled_from(["x\ud800", '"cache_control"']))
_KEYS = st.sampled_from(["type", "text", "content", "cache_control", "id"])
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(_KEYS, inner, max_size=3)), max_leaves=8)
_MARKER = {"type": "ephemeral"}


def _marked(value: Any, data: st.DataObject) -> Any:
    """``value`` with a marker added to some of its objects."""
    if isinstance(value, dict):
        out = {k: _marked(v, data) for k, v in value.items()}
        if data.draw(st.booleans()):
            out["cache_control"] = _MARKER
        return out
    if isinstance(value, list):
        return [_marked(v, data) for v in value]
    return value


def _same_content(a: Any, b: Any) -> bool:
    """The same value once markers are gone: equal types (True is not 1), equal key order."""
    a, b = strip_cache_control(a), strip_cache_control(b)
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same_content(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same_content, a, b))
    return bool(a == b)


@settings(max_examples=300, deadline=None)
@given(message=st.dictionaries(_KEYS, _VALUES, max_size=4), data=st.data())
def test_markers_anywhere_change_no_fingerprint(message: dict[str, Any],
                                                data: st.DataObject) -> None:
    assert fingerprint(_marked(message, data)) == fingerprint(strip_cache_control(message))


@settings(max_examples=500, deadline=None)
@given(a=st.dictionaries(_KEYS, _VALUES, max_size=3), b=st.dictionaries(_KEYS, _VALUES, max_size=3))
def test_equal_fingerprints_are_equal_content(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert (fingerprint(a) == fingerprint(b)) == _same_content(a, b)


def test_lone_surrogates_and_values_that_are_not_json_have_fingerprints() -> None:
    """A text a layer cut in half, a value no JSON encoder writes: hashed like any other,
    markers left out."""
    broken = {"type": "text", "text": "half \ud800"}
    assert fingerprint(broken) == fingerprint({**broken, "cache_control": _MARKER})
    assert fingerprint(broken) != fingerprint({"type": "text", "text": "half \ud801"})
    assert fingerprint({"n": 1j}) == fingerprint({"n": 1j, "cache_control": _MARKER})
    assert fingerprint({"n": 1j}) != fingerprint({"n": 2j})


# -- stable digests kept by fingerprint ------------------------------------------------------


def test_a_stable_digest_is_made_once_per_fingerprint_while_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """stable_digest_of gives stable_digest's value, serialising a message once while its
    fingerprint is kept (a spy counts the real function's calls); the cache is bounded."""
    made: list[object] = []

    def spy(value: object) -> str:
        made.append(value)
        return stable_digest(value)

    monkeypatch.setattr(fingerprints, "stable_digest", spy)
    monkeypatch.setattr(fingerprints, "_DIGESTS", type(fingerprints._DIGESTS)())
    monkeypatch.setattr(fingerprints, "DIGEST_CACHE_ENTRIES", 3)
    messages = [{"role": "user", "content": [{"type": "text", "text": f"message {n}"}]}
                for n in range(5)]
    for message in messages:
        assert stable_digest_of(message, fingerprint(message)) == stable_digest(message)
    assert len(made) == 5 and len(fingerprints._DIGESTS) == 3  # the newest three kept
    # the same content with a cache marker: the same fingerprint, the digest kept
    marked = {"role": "user", "content": [{"type": "text", "text": "message 4",
                                           "cache_control": {"type": "ephemeral"}}]}
    assert stable_digest_of(marked, fingerprint(marked)) == stable_digest(marked)
    assert stable_digest(marked) == stable_digest(messages[4])
    assert len(made) == 5  # not serialised again
    assert stable_digest_of(messages[0], fingerprint(messages[0])) == stable_digest(messages[0])
    assert len(made) == 6  # evicted: made anew


def test_a_checkpoint_holds_the_stable_digest_of_every_message_it_covers() -> None:
    raw = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
           {"role": "user", "content": [{"type": "text", "text": "c",
                                         "cache_control": {"type": "ephemeral"}}]}]
    checkpoint = CompactionCheckpoint.build(raw, raw, "key", ())
    assert checkpoint.digests == tuple(stable_digest(m) for m in raw)
    # read back by another process (no fingerprints of its own): matched by the digests
    restored = CompactionCheckpoint.from_bytes(checkpoint.to_bytes())
    assert restored is not None and restored.matches(raw, [fingerprint(m) for m in raw])
