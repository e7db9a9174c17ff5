"""Sticky compaction: a session's compacted prefix is reused while its history only grows."""

from __future__ import annotations

import copy

from compactor import (
    CachingCounter,
    Chars4Counter,
    CompactionCheckpoint,
    CompactionOptions,
    compact_context,
)
from compactor._fingerprint import strip_cache_control
from compactor._l4_summary import is_summary_message
from policies import CompactionPolicy
from proxy.fake_upstream.rules import check_messages_request

from .builders import exchange, text, user

POLICY = CompactionPolicy(soft_threshold_tokens=3_000, hard_limit_tokens=50_000,
                          max_tool_result_tokens=400, keep_recent_messages=12,
                          summary_keep_recent=4)


def _turn(messages: list, n: int) -> list:
    """The history after one more agent turn (a call and its result)."""
    return [*messages, *exchange(f"toolu_{n:04d}", f"output {n}\n" * 200, command=f"step {n}")]


class Session:
    """Drives compact_context like the proxy does: one checkpoint carried between calls."""

    def __init__(self, policy: CompactionPolicy = POLICY, *, copy: bool = True) -> None:
        self.policy = policy
        self.copy = copy  # False: the caller's objects, as the proxy passes them
        self.counter = CachingCounter(Chars4Counter())
        self.checkpoint: CompactionCheckpoint | None = None
        self.summary_inputs: list[str] = []

    def summarise(self, payload: str) -> str:
        self.summary_inputs.append(payload)
        return f"summary number {len(self.summary_inputs)}"

    def send(self, messages: list):
        result = compact_context(messages, None, policy=self.policy, counter=self.counter,
                                 summarizer=self.summarise,
                                 options=CompactionOptions(checkpoint=self.checkpoint,
                                                           sticky=True, copy=self.copy))
        check_messages_request({"model": "m", "max_tokens": 1, "messages": result.messages})
        self.checkpoint = result.checkpoint
        return result


def _grow_until_compacted(session: Session, messages: list, start: int = 0):
    n = start
    while True:
        messages = _turn(messages, n)
        n += 1
        result = session.send(messages)
        if result.changed:
            return messages, result, n


def test_the_next_request_reuses_the_compacted_prefix_byte_for_byte() -> None:
    """After a compaction, a grown history gets the same prefix plus its new messages."""
    session = Session()
    messages, first, n = _grow_until_compacted(session, [user("Original intent")])
    grown = _turn(messages, n)
    second = session.send(grown)
    assert second.reused_checkpoint
    prefix = [strip_cache_control(m) for m in first.messages]
    assert second.messages[: len(prefix)] == prefix
    # The new turn follows (its oversized tool result cut by L1, as always).
    assert len(second.messages) == len(prefix) + 2
    assert second.messages[len(prefix)] == grown[len(messages)]


def test_summary_calls_happen_only_when_the_threshold_is_crossed_again() -> None:
    """Over a long session L4 runs once per crossing, not once per request."""
    session = Session()
    messages = [user("Original intent")]
    crossings = 0
    for n in range(120):
        messages = _turn(messages, n)
        result = session.send(messages)
        if result.outcomes:
            crossings += 1
        assert result.tokens_after < POLICY.hard_limit_tokens
    assert 0 < len(session.summary_inputs) <= crossings < 60


def test_a_new_summary_is_made_from_the_previous_one_plus_newly_aged_messages() -> None:
    """The second summary's input holds the first summary, not the messages it covered."""
    session = Session()
    messages = [user("Original intent")]
    n = 0
    while len(session.summary_inputs) < 2:
        messages = _turn(messages, n)
        n += 1
        session.send(messages)
    first_input, second_input = session.summary_inputs
    # (The first summary's artifact trail names the command "step 0", not its call.)
    assert "toolu_0000" in first_input and "toolu_0000" not in second_input
    assert "ran step 0" in second_input
    assert "summary number 1" in second_input


def test_an_edited_history_falls_back_to_a_fresh_compaction() -> None:
    """A client that rewrote an old message does not get the stale prefix."""
    session = Session()
    messages, _, n = _grow_until_compacted(session, [user("Original intent")])
    edited = copy.deepcopy(_turn(messages, n))
    edited[3]["content"][0]["content"] = "the client rewrote this result"
    result = session.send(edited)
    assert not result.reused_checkpoint


def test_moved_cache_markers_do_not_break_the_match() -> None:
    """Clients move cache_control to the newest message every turn; that is not an edit."""
    session = Session()
    messages, _, n = _grow_until_compacted(session, [user("Original intent")])
    grown = copy.deepcopy(_turn(messages, n))
    grown[-1]["content"][0]["cache_control"] = {"type": "ephemeral"}
    for message in grown[:-1]:
        for block in message["content"] if isinstance(message["content"], list) else ():
            block.pop("cache_control", None)
    result = session.send(grown)
    assert result.reused_checkpoint
    assert result.messages[-1]["content"][0]["cache_control"] == {"type": "ephemeral"}


def test_a_checkpoint_survives_a_restart_through_the_store_format() -> None:
    """A checkpoint read back from bytes (another process) matches by its fingerprints."""
    session = Session()
    messages, first, n = _grow_until_compacted(session, [user("Original intent")])
    assert session.checkpoint is not None
    restored = CompactionCheckpoint.from_bytes(session.checkpoint.to_bytes())
    assert restored is not None and restored == session.checkpoint
    session.checkpoint = restored
    assert session.send(_turn(messages, n)).reused_checkpoint


def test_unreadable_checkpoint_bytes_give_none() -> None:
    """A corrupt or outdated stored checkpoint is ignored, never trusted."""
    assert CompactionCheckpoint.from_bytes(b"not json") is None
    assert CompactionCheckpoint.from_bytes(b'{"format": 999}') is None
    broken = (b'{"format": 2, "covered": 2, "view": [], '
              b'"fingerprints": [1], "policy_key": "", "layers": []}')
    assert CompactionCheckpoint.from_bytes(broken) is None
    not_ints = broken.replace(b"[1]", b'[1, "2"]')
    assert CompactionCheckpoint.from_bytes(not_ints) is None
    fine = broken.replace(b"[1]", b"[1, 18446744073709551615]")
    assert CompactionCheckpoint.from_bytes(fine) is not None


def test_other_thresholds_do_not_reuse_the_checkpoint() -> None:
    """A checkpoint is valid only for the policy it was made with."""
    session = Session()
    messages, _, n = _grow_until_compacted(session, [user("Original intent")])
    session.policy = CompactionPolicy(soft_threshold_tokens=3_500, hard_limit_tokens=50_000,
                                      max_tool_result_tokens=400)
    assert not session.send(_turn(messages, n)).reused_checkpoint


def test_a_sticky_compaction_clears_below_the_compact_to_ratio() -> None:
    """Once it compacts, sticky mode goes on until soft × compact_to_ratio."""
    session = Session()
    _, result, _ = _grow_until_compacted(session, [user("Original intent")])
    assert result.tokens_after < POLICY.soft_threshold_tokens * POLICY.compact_to_ratio


def test_the_first_user_message_survives_every_sticky_request() -> None:
    """Across many reused and fresh compactions the original intent is still first."""
    session = Session()
    intent = user(text("Original intent: keep me"))
    messages = [intent]
    for n in range(60):
        messages = _turn(messages, n)
        result = session.send(messages)
        assert result.messages[0] == intent
        assert sum(is_summary_message(m) for m in result.messages) <= 1


def test_a_broken_new_turn_is_rejected_with_its_index_in_the_clients_history() -> None:
    """A reused prefix does not hide a protocol error in the new messages, and the error
    names the message by its position in what the client sent."""
    import pytest

    from compactor import ToolProtocolError

    from .builders import assistant, tool_use

    session = Session()
    messages, _, n = _grow_until_compacted(session, [user("Original intent")])
    broken = [*messages, assistant(tool_use("toolu_dangling")), user("no result for it")]
    with pytest.raises(ToolProtocolError) as caught:
        session.send(broken)
    assert (caught.value.kind, caught.value.message_index) == ("missing", len(messages))


def test_a_restored_checkpoint_is_matched_by_digest_once_then_by_fingerprint() -> None:
    """After a restart the first warm request returns the checkpoint with this process's
    fingerprints; the next one reuses that very object (no digest walk, nothing to save)."""
    session = Session()
    messages, _, n = _grow_until_compacted(session, [user("Original intent")])
    assert session.checkpoint is not None
    session.checkpoint = CompactionCheckpoint.from_bytes(session.checkpoint.to_bytes())
    messages = _turn(messages, n)
    first = session.send(messages)
    assert first.reused_checkpoint
    assert len(first.checkpoint.fingerprints) == first.checkpoint.covered
    second = session.send(_turn(messages, n + 1))
    assert second.reused_checkpoint and second.checkpoint is first.checkpoint


def test_the_new_messages_are_cut_once_and_an_edited_one_again() -> None:
    """Each reuse cuts only what is new since the last one (the others are the same objects
    as last time), gives what cutting all of them afresh gives, and cuts an edited message
    after the checkpoint again."""
    session = Session(CompactionPolicy(soft_threshold_tokens=3_000, hard_limit_tokens=10**6,
                                       max_tool_result_tokens=100, keep_recent_messages=12,
                                       summary_keep_recent=4), copy=False)
    messages, first, n = _grow_until_compacted(session, [user("Original intent")])
    checkpoint = session.checkpoint
    assert checkpoint is not None
    covered = len(first.messages)
    views = []
    for _ in range(3):
        messages = _turn(messages, n)
        n += 1
        views.append(session.send(messages).messages)
        assert session.checkpoint is checkpoint  # reused, not remade
    # The same objects for what an earlier reuse cut; the same view as a checkpoint that
    # never cut anything before (a copy read back from the store).
    assert all(a is b for a, b in zip(views[1][covered:], views[2][covered:len(views[1])],
                                      strict=True))
    restored = CompactionCheckpoint.from_bytes(checkpoint.to_bytes())
    whole = compact_context(messages, None, policy=session.policy, counter=session.counter,
                            options=CompactionOptions(checkpoint=restored, sticky=True))
    assert whole.reused_checkpoint and whole.messages == views[2]
    # A cut result the client then changed (after the checkpoint): cut again, not reused.
    edited = copy.deepcopy(messages)
    index = len(messages) - 3
    edited[index]["content"][0]["content"] = "edited\n" * 300
    again = session.send(edited)
    assert again.reused_checkpoint
    assert again.messages[covered + index - checkpoint.covered] != views[2][covered + index
                                                                            - checkpoint.covered]
    assert "edited" in str(again.messages[covered + index - checkpoint.covered])


def test_a_marker_the_client_moved_on_is_not_brought_back_by_a_reuse() -> None:
    """Claude Code moves its cache_control marker to the newest message every turn. The
    messages after the checkpoint that an earlier reuse cut are reused only as the very
    objects they were cut from: the view carries the markers of this request only (the
    provider refuses more than four), and equals cutting every new message afresh."""
    session = Session(CompactionPolicy(soft_threshold_tokens=3_000, hard_limit_tokens=10**6,
                                       max_tool_result_tokens=100, keep_recent_messages=12,
                                       summary_keep_recent=4), copy=False)
    messages, _, n = _grow_until_compacted(session, [user("Original intent")])
    checkpoint = session.checkpoint
    for _ in range(6):
        messages = _turn(messages, n)
        n += 1
        # As a client sends it (and the proxy decodes it): the same objects for unchanged
        # messages, a new one for the newest, marked; the one marked before is unmarked.
        marked = [*messages[:-1], copy.deepcopy(messages[-1])]
        marked[-1]["content"][0]["cache_control"] = {"type": "ephemeral"}
        result = session.send(marked)  # check_messages_request: at most 4 markers
        assert session.checkpoint is checkpoint
        markers = str(result.messages).count("cache_control")
        assert markers <= 2, markers
        restored = CompactionCheckpoint.from_bytes(checkpoint.to_bytes())
        whole = compact_context(marked, None, policy=session.policy, counter=session.counter,
                                options=CompactionOptions(checkpoint=restored, sticky=True))
        assert whole.messages == result.messages
