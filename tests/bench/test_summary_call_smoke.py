"""bench/summary_call.py at a tiny size: a structure check, not a timed test."""

from __future__ import annotations

import asyncio
import json
import math

from bench import summary_call


def test_both_ways_make_a_summary_call_and_the_table_prints() -> None:
    """Each size gives a fork of at least that many bytes that the strict provider answered
    both ways (each call asserts a summary came back), with a CPU figure for each."""
    costs = asyncio.run(summary_call.measure([20_000, 60_000], calls=2))
    assert costs[0].conversation_bytes >= 20_000 and costs[1].conversation_bytes >= 60_000
    assert costs[0].messages < costs[1].messages
    for cost in costs:
        assert math.isfinite(cost.proxy_ms) and cost.proxy_ms > 0
        assert math.isfinite(cost.sdk_create_ms) and cost.sdk_create_ms > 0
    table = summary_call.format_costs(costs)
    assert table.count("\n") == 3 and "KB" in table


def test_a_fork_ends_where_a_user_turn_may_follow() -> None:
    """The conversation is cut where the fork can ask for its summary: the call's last
    message is the fork's instruction, after the corpus's own messages."""
    source, conversation, call = summary_call.fork_of(summary_call.CORPUS, 30_000)
    assert sum(len(json.dumps(m)) for m in conversation) >= 30_000
    assert len(call.messages) == len(conversation) + 1
    assert call.messages[-1]["role"] == "user" and source.tools is not None
