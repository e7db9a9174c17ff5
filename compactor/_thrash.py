"""The thrash guard: a session that crosses the soft threshold again right after a compaction.

One huge tool result per turn can push a sticky session over the soft threshold on almost
every request; compacting to the usual depth then pays an L4 summary (and a cache miss) on each
of them. A re-crossing within :data:`THRASH_WITHIN_MESSAGES` new messages of the checkpoint
(about three requests: each adds an answer and a user turn) is a thrash: the result says so
(the proxy logs and counts it, ``compaction_thrash``) and the compaction goes deeper: to
``soft × compact_to_ratio × THRASH_DEPTH``, with L3 and L4 keeping half their recent messages
(:func:`deeper`), so the next crossing is further away. It stays deeper for as long as the
session keeps re-crossing that soon. The policy's key (and so the checkpoint) is unchanged.
"""

from __future__ import annotations

from dataclasses import replace

from policies import CompactionPolicy

from ._sticky import CompactionCheckpoint

__all__: list[str] = []

#: New messages since the last compaction within which a crossing counts as a thrash.
THRASH_WITHIN_MESSAGES = 6
#: How much deeper a compaction goes on a thrash (a factor on its usual target).
THRASH_DEPTH = 0.5


def is_thrash(recrossed: bool, checkpoint: CompactionCheckpoint | None, messages: int) -> bool:
    """True when a reused ``checkpoint``'s view is over the soft threshold again
    (``recrossed``) with 1 to :data:`THRASH_WITHIN_MESSAGES` messages added since it was
    made (``messages``: the request's count)."""
    # (No new message: the same history sent again, a retry, is no thrash.)
    return (recrossed and checkpoint is not None
            and 0 < messages - checkpoint.covered <= THRASH_WITHIN_MESSAGES)


def deeper(policy: CompactionPolicy) -> CompactionPolicy:
    """``policy`` with L3 and L4 keeping half their recent messages (at least one exchange)."""
    return replace(policy, keep_recent_messages=max(2, policy.keep_recent_messages // 2),
                   summary_keep_recent=max(2, policy.summary_keep_recent // 2))
