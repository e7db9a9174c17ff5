"""CachedStateReads: state reads are cached briefly; writes through it are seen at once."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from compactor import DurableContextState, DurableFact
from proxy.state.store import CachedStateReads, SQLiteStateStore


def _state(text: str) -> DurableContextState:
    return DurableContextState(facts=(DurableFact("f1", text, "transcript:s:1",
                                                  datetime(2026, 1, 1, tzinfo=UTC)),))


async def test_a_write_through_the_cache_is_seen_by_the_next_read(tmp_path: Path) -> None:
    """An admin write via the same object invalidates the cached (absent) read."""
    inner = await SQLiteStateStore(tmp_path / "s.db").open()
    store = CachedStateReads(inner)
    try:
        assert await store.get_state("s") is None
        await store.put_state("s", _state("one"), None)
        stored = await store.get_state("s")
        assert stored is not None and stored.state.facts[0].content == "one"
        await store.delete_state("s")
        assert await store.get_state("s") is None
    finally:
        await inner.close()


async def test_another_writer_is_seen_after_the_ttl(tmp_path: Path) -> None:
    """A write that bypasses the cache (another process) shows once the entry expires."""
    inner = await SQLiteStateStore(tmp_path / "s.db").open()
    store = CachedStateReads(inner, ttl_s=0.05)
    other = await SQLiteStateStore(tmp_path / "s.db").open()
    try:
        assert await store.get_state("s") is None
        await other.put_state("s", _state("elsewhere"), None)
        assert await store.get_state("s") is None  # still cached
        import asyncio

        await asyncio.sleep(0.06)
        stored = await store.get_state("s")
        assert stored is not None and stored.state.facts[0].content == "elsewhere"
    finally:
        await inner.close()
        await other.close()
