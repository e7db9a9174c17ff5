"""Facts a caller kept about each message (:class:`compactor.MessageFact`): a pipeline given
them produces exactly what it produces without them, and looks only at what is new."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from compactor import (
    CachingCounter,
    Chars4Counter,
    CompactionCheckpoint,
    CompactionOptions,
    MessageShapeError,
    TiktokenCounter,
    compact_context,
    message_fact,
    message_facts,
)
from policies import CompactionPolicy

from .builders import exchange, text, user
from .test_tokens import _RecordingTiktoken

POLICY = CompactionPolicy(soft_threshold_tokens=3_000, hard_limit_tokens=50_000,
                          max_tool_result_tokens=400, keep_recent_messages=12,
                          summary_keep_recent=4)


def _history(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [user(text("fix the build"))]
    for n in range(turns):
        messages.extend(exchange(f"toolu_{n:04d}", f"output {n}\n" * 200, command=f"step {n}"))
    return messages


def _marked(messages: list[dict[str, Any]], index: int) -> list[dict[str, Any]]:
    """``messages`` with a cache breakpoint on the last block of message ``index``."""
    out = list(messages)
    content = [dict(block) for block in out[index]["content"]]
    content[-1]["cache_control"] = {"type": "ephemeral"}
    out[index] = {**out[index], "content": content}
    return out


def _run(messages: list[dict[str, Any]], counter: CachingCounter,
         checkpoint: CompactionCheckpoint | None, with_facts: bool) -> Any:
    facts = [message_fact(m, counter) for m in messages] if with_facts else None
    return compact_context(messages, None, policy=POLICY, counter=counter,
                           summarizer=lambda payload: "the summary",
                           options=CompactionOptions(sticky=True, checkpoint=checkpoint,
                                                     copy=False, facts=facts))


def test_a_session_with_facts_forwards_exactly_what_one_without_them_does() -> None:
    """Turn after turn, crossings and reuse included, with the breakpoint moving every turn."""
    counter = CachingCounter(Chars4Counter())
    plain = kept = None
    for turns in range(2, 40):
        messages = _marked(_history(turns), -1)
        if turns > 2:
            messages = _marked(messages, -3)  # Claude Code marks the turn before, too
        without = _run(messages, counter, plain, with_facts=False)
        given = _run(messages, counter, kept, with_facts=True)
        assert given.messages == without.messages
        assert (given.tokens_before, given.tokens_after, given.layers_applied) == (
            without.tokens_before, without.tokens_after, without.layers_applied)
        assert given.reused_checkpoint == without.reused_checkpoint
        plain, kept = without.checkpoint, given.checkpoint
    assert kept is not None and kept.layers  # it did cross, and reuse


def test_facts_of_another_length_are_a_mistake() -> None:
    counter = CachingCounter(Chars4Counter())
    messages = _history(2)
    facts = [message_fact(m, counter) for m in messages[:-1]]
    with pytest.raises(ValueError, match="facts"):
        compact_context(messages, None, policy=POLICY, counter=counter,
                        options=CompactionOptions(facts=facts))


def test_a_message_of_the_wrong_shape_has_no_fact_and_is_named_by_its_index() -> None:
    counter = CachingCounter(Chars4Counter())
    messages = [*_history(1), {"role": "user", "content": [5]}]
    facts = [message_fact(m, counter) for m in messages]
    assert facts[-1] is None and all(f is not None for f in facts[:-1])
    with pytest.raises(MessageShapeError, match=r"messages\.3\.content\.0"):
        compact_context(copy.deepcopy(messages), None, policy=POLICY, counter=counter,
                        options=CompactionOptions(facts=facts))


def test_a_fact_says_whether_a_marker_is_there_and_ignores_it_in_the_fingerprint() -> None:
    counter = CachingCounter(Chars4Counter())
    message = _history(1)[1]
    marked = _marked([message], 0)[0]
    plain_fact, marked_fact = message_fact(message, counter), message_fact(marked, counter)
    assert plain_fact is not None and marked_fact is not None
    assert (plain_fact.marked, marked_fact.marked) == (False, True)
    assert plain_fact.fingerprint == marked_fact.fingerprint
    assert plain_fact.tokens == counter.count_message(message)


def test_message_facts_are_each_messages_fact_with_long_texts_in_one_batch() -> None:
    """The same facts as one message at a time (None for a malformed message); the long
    texts of a cold history counted in one parallel batch first."""
    messages: list[Any] = [*_history(6), {"role": "user", "content": [7]},
                           user(text("long result " * 20_000)),
                           user(text("another long one " * 20_000))]
    base = _RecordingTiktoken()
    made = message_facts(messages, CachingCounter(base))
    assert made == [message_fact(m, CachingCounter(TiktokenCounter())) for m in messages]
    assert made[-3] is None
    assert base.batches == [2]
