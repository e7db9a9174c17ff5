"""Durable state items built for the state tests: one fact, pending item and evidence each."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from compactor._state_items import DurableFact, PendingItem, RetrievalEvidence

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
NAIVE = datetime(2025, 3, 1, 12, 0)


def fact(fact_id: str = "f1", pointer: str = "transcript:s1:1") -> DurableFact:
    return DurableFact(fact_id, "the build uses uv", pointer, T0)


def item(item_id: str = "p1", pointer: str = "transcript:s1:2") -> PendingItem:
    return PendingItem(item_id, "rotate the staging key", pointer, T0)


def evidence(memory_id: str = "m1", source_id: str = "transcript:s1:3",
             **overrides: Any) -> RetrievalEvidence:
    values: dict[str, Any] = dict(
        memory_id=memory_id, source_id=source_id, source_type="transcript",
        source_title="design review", captured_at=T0, score=0.5, source_rank=1,
    )
    values.update(overrides)
    return RetrievalEvidence(**values)
