"""The audit batches both stores write through: one write and one future per batch."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from proxy.audit.log import RequestEntry
from proxy.store.audit_batches import MAX_AUDIT_BATCH, AuditBatches


def entry(index: int) -> RequestEntry:
    return RequestEntry(at=datetime(2026, 1, 1, tzinfo=UTC), request_id=f"r{index}",
                        session_id="s", tenant="none", route="messages")


async def test_entries_added_within_the_linger_are_one_write() -> None:
    written: list[list[str]] = []

    async def write(batch: list[RequestEntry]) -> None:
        written.append([e.request_id for e in batch])

    batches = AuditBatches(write, linger_s=0.05)
    futures = [batches.add(entry(n)) for n in range(MAX_AUDIT_BATCH + 2)]
    assert written == []  # nothing before the linger
    await asyncio.gather(*futures)
    assert [len(batch) for batch in written] == [MAX_AUDIT_BATCH, 2]
    assert futures[0] is futures[MAX_AUDIT_BATCH - 1] is not futures[-1]
    late = batches.add(entry(999))
    await batches.flush()  # now, not after the linger
    assert late.done() and written[-1] == ["r999"]


async def test_a_failed_write_fails_its_batch_only() -> None:
    calls = 0

    async def write(batch: list[RequestEntry]) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("down")

    batches = AuditBatches(write, linger_s=0.01)
    failed = batches.add(entry(1))
    with pytest.raises(RuntimeError, match="down"):
        await failed
    await batches.add(entry(2))  # a new batch, written
    assert calls == 2


def test_a_negative_linger_is_refused() -> None:
    async def write(batch: list[RequestEntry]) -> None:
        del batch

    with pytest.raises(ValueError, match="linger_s"):
        AuditBatches(write, linger_s=-1)
