"""The thrash guard: a session that crosses the soft threshold again right after a compaction.

One huge tool result per turn could cost an L4 summary on every request. A re-crossing within
:data:`THRASH_WITHIN_MESSAGES` new messages (about three requests) is a thrash: logged
(``compaction_thrash``) and compacted deeper, to ``soft × compact_to_ratio × THRASH_DEPTH`` with
L3 and L4 keeping half their recent messages; the policy key stays the same.
"""

from __future__ import annotations

from dataclasses import replace

from policies import CompactionPolicy

from ._sticky import CompactionCheckpoint

#: New messages since the last compaction within which a crossing counts as a thrash.
THRASH_WITHIN_MESSAGES = 6
#: How much deeper a compaction goes on a thrash (a factor on its usual target).
THRASH_DEPTH = 0.5


def is_thrash(recrossed: bool, checkpoint: CompactionCheckpoint | None, messages: int) -> bool:
    """True when a reused ``checkpoint``'s view is over the soft threshold again with 1 to
    :data:`THRASH_WITHIN_MESSAGES` messages added since (none: a retry)."""
    return (recrossed and checkpoint is not None
            and 0 < messages - checkpoint.covered <= THRASH_WITHIN_MESSAGES)


def deeper(policy: CompactionPolicy) -> CompactionPolicy:
    """``policy`` with L3 and L4 keeping half their recent messages (at least one exchange)."""
    return replace(policy, keep_recent_messages=max(2, policy.keep_recent_messages // 2),
                   summary_keep_recent=max(2, policy.summary_keep_recent // 2))
