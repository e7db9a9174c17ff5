"""Content fingerprints (:func:`compactor._fingerprint.fingerprint`): equal for the same
content with its ``cache_control`` markers moved or gone (whatever its keys' order),
different for different content (types included), for any JSON value, lone surrogates
included; derived from the canonical JSON bytes alone (the same in every process: see
``tests/proxy/server/test_fingerprints_across_processes.py``)."""

from __future__ import annotations

from typing import Any

import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from compactor import CompactionCheckpoint
from compactor._fingerprint import fingerprint, strip_cache_control

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
    """The same value once markers are gone: equal types (True is not 1), any key order."""
    a, b = strip_cache_control(a), strip_cache_control(b)
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return set(a) == set(b) and all(_same_content(a[k], b[k]) for k in a)
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
    assert fingerprint({"n": 1j}) != fingerprint({"n": "complex:1j"})


def test_the_fingerprint_is_xxh3_of_the_canonical_json() -> None:
    """Pinned: checkpoints and calibration snapshots in the store hold fingerprints, so a
    change of derivation must bump their formats (``CHECKPOINT_FORMAT``, ``_SNAPSHOT_FORMAT``)."""
    message = {"role": "user", "content": [
        {"type": "text", "text": "h\u00e9", "cache_control": {"type": "ephemeral"}}]}
    canonical = '{"content":[{"text":"h\u00e9","type":"text"}],"role":"user"}'.encode()
    assert fingerprint(message) == xxhash.xxh3_64_intdigest(canonical)
    assert fingerprint({"role": "user", "content": "x"}) == fingerprint(
        {"content": "x", "role": "user"})
    assert 0 <= fingerprint(message) < 2**64


def test_a_checkpoint_holds_the_fingerprint_of_every_message_it_covers() -> None:
    raw = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
           {"role": "user", "content": [{"type": "text", "text": "c",
                                         "cache_control": {"type": "ephemeral"}}]}]
    checkpoint = CompactionCheckpoint.build(raw, raw, "key", ())
    assert checkpoint.fingerprints == tuple(fingerprint(m) for m in raw)
    # read back (another process): matched by the same fingerprints, markers moved
    restored = CompactionCheckpoint.from_bytes(checkpoint.to_bytes())
    assert restored == checkpoint
    # the client moved its marker to a new message: still the same history
    grown = [*strip_cache_control(raw), {"role": "assistant", "content": [
        {"type": "text", "text": "d", "cache_control": {"type": "ephemeral"}}]}]
    assert restored.matches(grown, [fingerprint(m) for m in grown])
    edited = [{"role": "user", "content": "A"}, *grown[1:]]
    assert not restored.matches(edited, [fingerprint(m) for m in edited])
