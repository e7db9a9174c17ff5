"""The request body as raw spans (:mod:`proxy.http.spans`): the same refusals as the plain
parser, messages decoded once per process, and a forwarded body spliced from the client's
bytes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import compactor
from proxy.http.body import parse_body
from proxy.http.errors import RequestRejected
from proxy.http.recent import RecentBodies
from proxy.http.spans import DecodedSpans, EncodedViews, parse_request

BIG_TEXT = "x" * 400  # long enough that the span is worth keeping


def _body(messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": messages, **fields}


def _sdk_bytes(body: dict[str, Any]) -> bytes:
    """As the Python SDK sends it: ``json.dumps`` defaults (spaces, ASCII escapes)."""
    return json.dumps(body).encode()


def _history(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"start {BIG_TEXT}"}]
    for turn in range(turns):
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": f"step {turn} {BIG_TEXT}"},
            {"type": "tool_use", "id": f"toolu_{turn:04d}", "name": "Read",
             "input": {"path": f"/src/f{turn}.py"}}]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{turn:04d}",
             "content": f"contents {turn} é ☃ {BIG_TEXT}"}]})
    return messages


@pytest.mark.parametrize("raw", [
    b"",
    b"not json",
    b"[1, 2]",
    b'{"messages": 3}',
    b'{"model": "m"}',
    b'{"messages": [1]}',
    b'{"messages": [], "system": 5}',
    b'{"messages": [], "temperature": 1e400}',
    b'{"messages": [], "metadata": {"n": ' + b"1" * 5000 + b"}}",
    b'{"messages": [{"role": "user", "content": "a"}], "x": NaN}',
    b'{"messages": [{"role": "user", "content": "\xff"}]}',
    b'{"messages": [{"role": "user", "content": "a"},]}',
    b'{"messages": []} trailing',
])
def test_every_refusal_is_the_plain_parsers_own(raw: bytes) -> None:
    """What the fast decoder refuses goes to the plain parser: the same status, reason and
    message, whichever path saw it first."""
    with pytest.raises(RequestRejected) as plain:
        parse_body(raw)
    with pytest.raises(RequestRejected) as fast:
        parse_request(raw, DecodedSpans())
    assert (fast.value.status, fast.value.reason, fast.value.message) == (
        plain.value.status, plain.value.reason, plain.value.message)


def test_a_body_with_a_lone_surrogate_takes_the_plain_path_and_is_mended() -> None:
    raw = b'{"messages": [{"role": "user", "content": "half \\ud83d of it"}], "model": "m"}'
    parsed = parse_request(raw, DecodedSpans())
    assert parsed.fields is None and parsed.mended == 1
    assert parsed.messages[0]["content"] == "half \ufffd of it"


def test_big_numbers_and_paired_surrogates_take_the_fast_path_unchanged() -> None:
    raw = _sdk_bytes(_body([{"role": "user", "content": "😀 " + BIG_TEXT}],
                           metadata={"n": 10**30, "f": 1e-400}))
    parsed = parse_request(raw, DecodedSpans())
    assert parsed.fields is not None and parsed.mended == 0
    assert parsed.doc == json.loads(raw)


def test_a_message_seen_before_is_not_decoded_again() -> None:
    """The second request's unchanged messages are the very objects of the first (and keep
    their facts); its new and changed messages are decoded anew."""
    cache = DecodedSpans()
    counter = compactor.CachingCounter()
    history = _history(3)
    first = parse_request(_sdk_bytes(_body(history)), cache)
    first_facts = first.facts(counter)
    grown = [*history, {"role": "assistant", "content": f"done {BIG_TEXT}"}]
    grown[2] = {**grown[2], "content": [{**grown[2]["content"][0],
                                         "cache_control": {"type": "ephemeral"}}]}
    second = parse_request(_sdk_bytes(_body(grown)), cache)
    second_facts = second.facts(counter)
    assert second_facts is not None and first_facts is not None
    assert first.entries is not None and second.entries is not None
    for index in (0, 1, 3, 4, 5, 6):
        assert second.messages[index] is first.messages[index]
        assert second.entries[index].memo["fact"] is first.entries[index].memo["fact"]
    assert second.messages[2] is not first.messages[2]  # its bytes changed: the marker
    changed, before = second_facts[2], first_facts[2]
    assert changed.fingerprint == before.fingerprint  # a marker is not content
    assert changed.marked and not before.marked
    assert second.messages == grown


def test_the_same_bytes_twice_in_one_request_are_two_objects() -> None:
    """The compactor tells messages apart by identity."""
    twice = {"role": "user", "content": [{"type": "text", "text": BIG_TEXT}]}
    history = [twice, {"role": "assistant", "content": "ok " + BIG_TEXT}, twice]
    parsed = parse_request(_sdk_bytes(_body(history)), DecodedSpans())
    assert parsed.messages[0] == parsed.messages[2]
    assert parsed.messages[0] is not parsed.messages[2]


def test_the_cache_stays_within_its_bytes() -> None:
    cache = DecodedSpans(max_bytes=4_000)
    for turn in range(40):
        parse_request(_sdk_bytes(_body(_history(turn % 5 + 1))), cache)
        parse_request(_sdk_bytes(_body([{"role": "user", "content": f"{turn} {BIG_TEXT}"}])),
                      cache)
    assert 0 < len(cache) <= 4_000 // 400
    off = DecodedSpans(max_bytes=0)
    parse_request(_sdk_bytes(_body(_history(2))), off)
    assert len(off) == 0


def test_the_spliced_body_keeps_the_clients_bytes_where_nothing_changed() -> None:
    """Fields and messages the proxy did not touch go out as the client sent them (the SDK's
    spacing and escapes); what it rewrote through the one encoder; the client's key order."""
    history = _history(2)
    body = _body(history, system=[{"type": "text", "text": "be brief"}],
                 metadata={"user_id": "u é"})
    raw = _sdk_bytes(body)
    parsed = parse_request(raw, DecodedSpans())
    rewritten = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_0001",
                                             "content": "[cut]"}]}
    view = [*parsed.messages[:4], rewritten]
    system = [{"type": "text", "text": "be brief"}, {"type": "text", "text": "durable ☃"}]
    out = parsed.encode(view, {"system": system, "added": True})
    decoded = json.loads(out)
    assert decoded == {**body, "messages": [*history[:4], rewritten], "system": system,
                       "added": True}
    assert list(decoded) == [*body, "added"]
    for message in history[:4]:
        assert json.dumps(message).encode() in out  # the client's bytes, spaces and all
    assert json.dumps({"user_id": "u é"}).encode() in out
    assert b'"durable \xe2\x98\x83"' in out  # rewritten: compact UTF-8, one encoder
    assert b'"content":"[cut]"' in out


def test_the_splice_is_the_same_whether_or_not_the_prefix_was_cached() -> None:
    """Bytes out depend on the view, never on what a cache held: a warm process and a
    process that decodes everything anew forward the same body."""
    raw = _sdk_bytes(_body(_history(4)))

    def splice(cache: DecodedSpans) -> bytes:
        parsed = parse_request(raw, cache)
        view = [parsed.messages[0], {"role": "assistant", "content": "summary"},
                *parsed.messages[5:]]
        return parsed.encode(view, {})

    warm = DecodedSpans()
    first = splice(warm)
    assert splice(warm) == first
    assert splice(DecodedSpans()) == first
    assert splice(DecodedSpans(max_bytes=0)) == first
    assert json.dumps(_history(4)[5]).encode() in first


def test_a_checkpoints_view_is_encoded_once_and_reused() -> None:
    history = _history(3)
    checkpoint = compactor.CompactionCheckpoint.build(history, history[:3], "p", ("L3",))
    views = EncodedViews()
    first = views.of(checkpoint)
    again = views.of(checkpoint)
    assert again[0][1] is first[0][1]
    parsed = parse_request(_sdk_bytes(_body(history)), DecodedSpans())
    out = parsed.encode([*checkpoint.view, *parsed.messages[3:]], {}, again)
    assert json.loads(out)["messages"] == [*history[:3], *history[3:]]
    assert views.of(None) == []


def test_a_rewritten_message_is_encoded_once_per_object() -> None:
    """What the encoder wrote for a message that is neither the client's nor the view's (a
    tool result L1 cut, the same object request after request) is kept for the next body on
    the same checkpoint, for that very object only: an equal copy is encoded afresh, and
    what the last body did not send is forgotten."""
    history = _history(3)
    checkpoint = compactor.CompactionCheckpoint.build(history, history[:3], "p", ("L3",))
    views = EncodedViews()
    since = views.since(checkpoint)
    assert since == {} and views.since(checkpoint) is since and views.since(None) is None
    parsed = parse_request(_sdk_bytes(_body(history)), DecodedSpans())
    cut = {"role": "user", "content": [{"type": "text", "text": "cut"}]}
    first = parsed.encode([*checkpoint.view, cut], {}, views.of(checkpoint), since)
    assert set(since) == {id(cut)} and since[id(cut)][0] is cut
    since[id(cut)] = (cut, b'{"role":"user","content":"as kept"}')  # trusted by identity
    again = parsed.encode([*checkpoint.view, cut], {}, views.of(checkpoint), since)
    assert json.loads(again)["messages"][-1]["content"] == "as kept"
    twin = json.loads(json.dumps(cut))
    fresh = parsed.encode([*checkpoint.view, twin], {}, views.of(checkpoint), since)
    assert fresh == first and set(since) == {id(twin)}


_PIECES = st.lists(st.one_of(st.integers(0, 6), st.sampled_from(["new", "pair"])), max_size=12)


@settings(max_examples=150, deadline=None)
@given(pieces=_PIECES, indent=st.sampled_from([None, 1]))
def test_any_view_is_spliced_into_the_document_it_stands_for(pieces: list[Any],
                                                             indent: int | None) -> None:
    """Whatever the view mixes — the client's messages in any order (a run of them that ends
    both lists goes out as one slice of the client's bytes, newlines between them and all),
    messages the proxy made, a checkpoint's messages — the body decodes to the document it
    stands for, in the client's key order."""
    history = _history(3)
    raw = json.dumps(_body(history, metadata={"user_id": "u"}), indent=indent).encode()
    parsed = parse_request(raw, DecodedSpans())
    pair_objects = [{"role": "assistant", "content": f"kept {n}"} for n in range(3)]
    encoded = [json.dumps(m, indent=2).encode() for m in pair_objects]
    view: list[dict[str, Any]] = []
    for number, piece in enumerate(pieces):
        if piece == "new":
            view.append({"role": "user", "content": f"made {number}"})
        elif piece == "pair":
            view.append(pair_objects[number % 3])
        else:
            view.append(parsed.messages[piece])
    view = [m for n, m in enumerate(view) if all(m is not o for o in view[:n])]  # distinct
    out = parsed.encode(view, {"system": "s"}, [(pair_objects, encoded)])
    decoded = json.loads(out)
    assert decoded == {**_body(history, metadata={"user_id": "u"}), "messages": view,
                       "system": "s"}
    assert list(decoded) == ["model", "max_tokens", "messages", "metadata", "system"]


def test_a_checkpoints_bytes_win_over_the_clients_for_the_same_object() -> None:
    """Whether a message goes out as the client's bytes depends on the view, not on whether
    a cache handed the checkpoint the client's very object: the checkpoint's bytes win, even
    within a run of the client's messages at the end."""
    history = _history(2)
    parsed = parse_request(_sdk_bytes(_body(history)), DecodedSpans())
    own = parsed.messages
    as_kept = json.dumps(own[3], indent=3).encode()
    out = parsed.encode(own, {}, [([own[3]], [as_kept])])
    assert as_kept in out and json.dumps(own[3]).encode() not in out
    assert json.dumps(own[4]).encode() in out and json.loads(out)["messages"] == history


def test_the_plain_path_encodes_like_before() -> None:
    raw = b'{"messages": [{"role": "user", "content": "a \\ud800"}], "model": "m"}'
    parsed = parse_request(raw, DecodedSpans())
    out = parsed.encode(parsed.messages, {"system": "s"})
    assert json.loads(out) == {"messages": [{"role": "user", "content": "a \ufffd"}],
                               "model": "m", "system": "s"}


def _marked_on(messages: list[dict[str, Any]], index: int) -> list[dict[str, Any]]:
    out = list(messages)
    content = out[index]["content"]
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    content = [dict(block) for block in content]
    content[-1]["cache_control"] = {"type": "ephemeral"}
    out[index] = {**out[index], "content": content}
    return out


def test_a_growing_conversation_is_read_from_where_it_stops_repeating() -> None:
    """Turn after turn (the SDK's bytes, a breakpoint moved to the newest message each time),
    the body is the previous one's objects plus what is new, and equals a whole fresh read:
    the same document, the same spliced bytes."""
    recent, cache = RecentBodies(), DecodedSpans()
    counter = compactor.CachingCounter()
    history = _history(2)
    for turn in range(12):
        history = [*history, {"role": "assistant", "content": f"turn {turn} {BIG_TEXT}"},
                   {"role": "user", "content": f"go on {turn}"}]
        raw = _sdk_bytes(_body(_marked_on(history, -1), system="be brief",
                               metadata={"user_id": "u"}))
        key = RecentBodies.key_of("none", "s1", raw)
        parsed = parse_request(raw, cache, recent, key)
        whole = parse_request(raw, DecodedSpans())
        assert parsed.doc == whole.doc == json.loads(raw)
        # Each message is its decoded entry's own object (repeated ones: the earlier body's).
        assert parsed.entries is not None
        assert all(message is entry.value
                   for message, entry in zip(parsed.messages, parsed.entries, strict=True))
        facts, whole_facts = parsed.facts(counter), whole.facts(compactor.CachingCounter())
        assert facts is not None and facts == whole_facts
        view = [*parsed.messages[:3], {"role": "assistant", "content": "summary"},
                *parsed.messages[5:]]
        twin = [*whole.messages[:3], {"role": "assistant", "content": "summary"},
                *whole.messages[5:]]
        assert parsed.encode(view, {"system": "s"}) == whole.encode(twin, {"system": "s"})
        if turn:
            assert parsed.reused >= len(history) - 3  # only the newest few were read
        else:
            assert parsed.reused == 0
        # What is kept for the next body (hashes at the last message starts), resumed from
        # the earlier body's hash states, is what a body read whole keeps.
        fresh = RecentBodies()
        fresh.keep(key, whole)
        assert recent._seen[key][0].cuts == fresh._seen[key][0].cuts
        assert bool(parsed._hashed) == bool(turn)


@pytest.mark.parametrize("change", ["system", "early message", "trailing comma", "not object",
                                    "shorter"])
def test_a_body_that_does_not_extend_the_last_one_is_read_whole(change: str) -> None:
    recent, cache = RecentBodies(), DecodedSpans()
    history = _history(4)
    first = _sdk_bytes(_body(history, system="be brief"))
    key = RecentBodies.key_of("none", "s1", first)
    parse_request(first, cache, recent, key)
    grown = [*history, {"role": "assistant", "content": "more " + BIG_TEXT}]
    raw = _sdk_bytes(_body(grown, system="be brief"))
    if change == "system":
        raw = _sdk_bytes(_body(grown, system="be verbose"))
    elif change == "early message":
        raw = _sdk_bytes(_body([{"role": "user", "content": "other"}, *grown[1:]],
                               system="be brief"))
    elif change == "trailing comma":
        raw = raw.replace(b'"}], "system"', b'"},], "system"')
        assert raw.count(b"},]") == 1
    elif change == "not object":
        raw = raw.replace(b', {"role": "assistant", "content": "more', b', 5, {"role": '
                          b'"assistant", "content": "more')
    elif change == "shorter":
        raw = _sdk_bytes(_body(history[:3], system="be brief"))
    if change in ("trailing comma", "not object"):
        with pytest.raises(RequestRejected) as plain:
            parse_body(raw)
        with pytest.raises(RequestRejected) as fast:
            parse_request(raw, cache, recent, key)
        assert fast.value.message == plain.value.message
        return
    parsed = parse_request(raw, cache, recent, key)
    assert parsed.doc == json.loads(raw)
    assert parsed.reused == 0


def test_two_conversations_under_one_key_each_find_their_own() -> None:
    recent, cache = RecentBodies(), DecodedSpans()
    a, b = _history(3), [{"role": "user", "content": "b " + BIG_TEXT}, *_history(3)[1:]]
    for turn in range(4):
        for history in (a, b):
            history.append({"role": "assistant", "content": f"{turn} {BIG_TEXT}"})
            history.append({"role": "user", "content": f"{turn} next"})
            raw = _sdk_bytes(_body(history))
            parsed = parse_request(raw, cache, recent, "same key")
            assert parsed.doc == json.loads(raw)
            if turn:
                assert parsed.reused > 0


def test_a_messages_array_whose_bytes_appear_twice_is_not_located_by_guess() -> None:
    """The same array as another field's value: where the messages are is not certain, so no
    byte is spliced or remembered from a guess; the forwarded body is still the right one."""
    history = _history(3)
    raw = _sdk_bytes({"metadata_copy": history, **_body(history)})
    recent, cache = RecentBodies(), DecodedSpans()
    parsed = parse_request(raw, cache, recent, RecentBodies.key_of("none", "dup", raw))
    assert parsed.bounds is None
    assert parsed.doc == json.loads(raw)
    view = [*parsed.messages[:2], {"role": "user", "content": "new"}]
    assert json.loads(parsed.encode(view, {})) == {**json.loads(raw), "messages": view}
    grown = _sdk_bytes({"metadata_copy": history,
                        **_body([*history, {"role": "user", "content": "more"}])})
    again = parse_request(grown, cache, recent, RecentBodies.key_of("none", "dup", grown))
    assert again.doc == json.loads(grown) and again.reused == 0
