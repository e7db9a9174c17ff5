"""The usage ledger's write buffer: additions summed in memory, written now and then."""

from __future__ import annotations

import asyncio
from pathlib import Path

from proxy.accounting.ledger_buffer import MAX_HELD, BufferedLedger
from proxy.accounting.usage import UsageEntry, UsageRow
from proxy.store import SQLiteStateStore, StoreError


class _FailingOnce:
    """A ledger whose first write fails."""

    def __init__(self) -> None:
        self.written: list[tuple[str, str, UsageEntry]] = []
        self.failed = False

    async def add_usage(self, session_key: str, model: str, entry: UsageEntry) -> None:
        if not self.failed:
            self.failed = True
            raise StoreError("down")
        self.written.append((session_key, model, entry))

    async def usage_rows(self) -> list[UsageRow]:
        return []


async def test_additions_are_summed_and_written_once_per_interval(tmp_path: Path) -> None:
    store = await SQLiteStateStore(tmp_path / "s.db").open()
    ledger = BufferedLedger(store, interval_s=0.05)
    for _ in range(100):
        ledger.add("s", "m", UsageEntry(requests=1, input_tokens=10))
    ledger.add("s", "other", UsageEntry(requests=1))
    assert len(ledger._pending["s", "m"]) < MAX_HELD  # held entries are summed now and then
    assert await store.usage_rows() == []  # nothing written yet: one write per interval
    await asyncio.sleep(0.2)
    rows = {(r.session_key, r.model): r.entry for r in await store.usage_rows()}
    assert rows[("s", "m")].requests == 100 and rows[("s", "m")].input_tokens == 1_000
    assert rows[("s", "other")].requests == 1
    ledger.add("s", "m", UsageEntry(requests=1))
    await ledger.close()  # what is pending at shutdown is written
    assert [r.entry.requests for r in await store.usage_rows() if r.model == "m"] == [101]
    await store.close()


async def test_a_failed_write_keeps_its_totals_for_the_next() -> None:
    backend = _FailingOnce()
    ledger = BufferedLedger(backend, interval_s=60)
    ledger.add("s", "m", UsageEntry(requests=2))
    await ledger.flush()
    assert backend.written == []
    ledger.add("s", "m", UsageEntry(requests=1))
    await ledger.close()
    assert backend.written == [("s", "m", UsageEntry(requests=3))]


def test_a_total_is_the_sum_of_every_counter() -> None:
    entries = [UsageEntry(requests=1, input_tokens=n, summary_output_tokens=2 * n)
               for n in range(5)]
    assert UsageEntry.total(entries) == UsageEntry(requests=5, input_tokens=10,
                                                   summary_output_tokens=20)
    assert UsageEntry.total(entries[:1]) is entries[0]
