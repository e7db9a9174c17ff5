"""The client's cache markers on a reused compacted prefix: where the client put them, now.

A retried request (the SDKs retry on 429, 529 and timeouts) repeats one the session already
compacted; it must go out byte-identical to its first attempt, cache markers included. And a
warm request's markers on older, covered messages (Claude Code marks the previous turn too)
must reach the provider, or its prompt cache misses.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from compactor import CompactionCheckpoint, CompactionOptions, compact_context
from policies import CompactionPolicy
from proxy.fake_upstream.rules import cache_control_count, check_messages_request

from .builders import assistant, exchange, text, tool_result, tool_use, user

MARK = {"type": "ephemeral"}
POLICY = CompactionPolicy(soft_threshold_tokens=3_000, hard_limit_tokens=50_000,
                          max_tool_result_tokens=400, keep_recent_messages=8,
                          summary_keep_recent=4)


def _history(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [user(text("Original intent: fix the build"))]
    for n in range(turns):
        messages += exchange(f"toolu_{n:04d}", f"output {n}\n" * 200, command=f"step {n}")
    messages[-1]["content"].append(text("keep going"))
    return messages


def _marked(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Three markers, as the issue saw them: the first message, the last tool_result (cut by
    L1, so edited), and the last message's last block."""
    marked = copy.deepcopy(messages)
    marked[0]["content"][0]["cache_control"] = MARK
    marked[-1]["content"][0]["cache_control"] = MARK  # the last tool_result
    marked[-1]["content"][-1]["cache_control"] = MARK
    return marked


def _send(messages: list[dict[str, Any]], checkpoint: CompactionCheckpoint | None = None):
    result = compact_context(messages, None, policy=POLICY,
                             options=CompactionOptions(checkpoint=checkpoint, sticky=True),
                             summarizer=lambda payload: "the summary")
    check_messages_request({"model": "m", "max_tokens": 1, "messages": result.messages})
    return result


def _bytes(messages: list[dict[str, Any]]) -> bytes:
    return json.dumps(messages, ensure_ascii=False, separators=(",", ":")).encode()


@pytest.mark.parametrize("restarted", [False, True])
def test_a_retry_is_forwarded_byte_identical_with_every_marker(restarted: bool) -> None:
    messages = _marked(_history(30))
    first = _send(messages)
    assert first.changed and first.checkpoint is not None
    assert cache_control_count({"messages": first.messages}) == 3
    checkpoint = first.checkpoint
    if restarted:  # the checkpoint came back from the store
        checkpoint = CompactionCheckpoint.from_bytes(checkpoint.to_bytes())
    retry = _send(copy.deepcopy(messages), checkpoint)
    assert retry.reused_checkpoint
    assert _bytes(retry.messages) == _bytes(first.messages)


def test_a_marker_on_an_older_covered_message_reaches_the_provider() -> None:
    """The next turn moves the last marker forward and keeps one on the previous turn."""
    messages = _history(30)
    first = _send(messages)
    grown = copy.deepcopy(messages) + exchange("toolu_next", "ok")
    grown[len(messages) - 1]["content"][-1]["cache_control"] = MARK  # previous turn's end
    grown[-1]["content"][0]["cache_control"] = MARK
    second = _send(grown, first.checkpoint)
    assert second.reused_checkpoint
    assert cache_control_count({"messages": second.messages}) == 2
    previous_end = second.messages[-3]["content"][-1]
    assert previous_end == {"type": "text", "text": "keep going", "cache_control": MARK}


def test_a_marker_keeps_its_key_position_inside_an_edited_block() -> None:
    """A marker written before the other keys stays there (bytes, not just content)."""
    messages = _history(30)
    last = messages[-1]["content"][0]
    messages[-1]["content"][0] = {"cache_control": MARK, **last}
    first = _send(messages)
    retry = _send(copy.deepcopy(messages), first.checkpoint)
    assert _bytes(retry.messages) == _bytes(first.messages)
    assert next(iter(retry.messages[-1]["content"][0])) == "cache_control"


def test_markers_on_removed_blocks_are_gone_and_none_is_added() -> None:
    messages = _history(30)
    messages[2]["content"][0]["cache_control"] = MARK  # an old result L3 or L4 removes
    first = _send(messages)
    retry = _send(copy.deepcopy(messages), first.checkpoint)
    assert cache_control_count({"messages": retry.messages}) == 0
    assert _bytes(retry.messages) == _bytes(first.messages)


def test_identical_messages_get_the_marker_on_the_right_one() -> None:
    """Two equal person messages ("go on"): the marker goes on the later one, as sent."""
    messages = _history(30)
    messages += [assistant("Paused."), user("go on"), assistant("Still paused."), user("go on")]
    messages[-3]["content"] = [text("go on")]
    messages[-1] = user(text("go on"))
    messages[-1]["content"][0]["cache_control"] = MARK
    first = _send(messages)
    retry = _send(copy.deepcopy(messages), first.checkpoint)
    assert _bytes(retry.messages) == _bytes(first.messages)
    assert "cache_control" not in retry.messages[-3]["content"][0]


def test_a_marked_block_inside_an_edited_assistant_message() -> None:
    """L2 took one read out of an assistant message; its marked text block keeps the marker."""
    messages = [user(text("Read both files"))]
    messages += [assistant(text("Reading both."), tool_use("r1", "Read", file_path="/a.py"),
                           tool_use("b1", "Bash", command="ls")),
                 user(tool_result("r1", "old " * 2000), tool_result("b1", "a.py"))]
    for n in range(12):
        messages += exchange(f"toolu_{n:04d}", f"output {n}\n" * 100, command=f"step {n}")
    messages += [assistant(tool_use("r2", "Read", file_path="/a.py")),
                 user(tool_result("r2", "new " * 2000), text("done?"))]
    messages[1]["content"][0]["cache_control"] = MARK
    policy = CompactionPolicy(soft_threshold_tokens=2_500, hard_limit_tokens=50_000,
                              max_tool_result_tokens=10**6, keep_recent_messages=40,
                              summary_keep_recent=4)
    first = compact_context(messages, None, policy=policy,
                            options=CompactionOptions(sticky=True))
    assert first.layers_applied == ("L2",)
    assert first.messages[1]["content"][0] == {"type": "text", "text": "Reading both.",
                                               "cache_control": MARK}
    retry = compact_context(copy.deepcopy(messages), None, policy=policy,
                            options=CompactionOptions(sticky=True, checkpoint=first.checkpoint))
    assert retry.reused_checkpoint
    assert _bytes(retry.messages) == _bytes(first.messages)
