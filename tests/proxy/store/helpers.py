"""What the store tests share: states, audit entries, key prefixes and StoreFactory."""

from __future__ import annotations

import sqlite3
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from compactor import DurableContextState, DurableFact, PendingItem, RetrievalEvidence
from proxy.audit.log import LayerSaving, RequestEntry
from proxy.store import RedisStateStore, SQLiteStateStore, StoreBackend

WHEN = datetime(2025, 3, 1, 12, 30, tzinfo=UTC)
BACKENDS = ["sqlite", "redis", "redis-cluster"]


def make_state(tag: str = "a", facts: int = 1) -> DurableContextState:
    """A state with every kind of item; ``tag`` makes contents distinct."""
    return DurableContextState(
        facts=tuple(
            DurableFact(f"fact-{tag}-{i}", f"the build for {tag} uses tox ({i})",
                        f"transcript:sess-1:{i + 1}", WHEN)
            for i in range(facts)
        ),
        pending_items=(
            PendingItem(f"todo-{tag}", f"rerun the flaky test ({tag})", "transcript:sess-1:9",
                        WHEN.astimezone(timezone(timedelta(hours=2)))),
        ),
        retrieval_evidence=(
            RetrievalEvidence(f"mem-{tag}", "artifact:sess-1:notes.md:" + "ab" * 6, "doc",
                              "Notes", WHEN, 0.75, 1, conflict_key="build-tool"),
        ),
    )


def unique_prefix() -> str:
    """A Redis key prefix no other test uses, so tests sharing the server never see each other."""
    return f"test-{uuid.uuid4().hex}:"


@dataclass(frozen=True)
class StoreFactory:
    """Where one test's store lives (a SQLite file, or a Redis URL plus a key prefix of its
    own); picklable, so a child process can open its own store on the same data."""

    backend: str
    location: str
    key_prefix: str = ""

    async def open(self, *, max_summaries: int = 1000, max_requests_per_session: int = 1000,
                   retention_days: int = 14) -> StoreBackend:
        """A new store instance on this test's data."""
        # (A short linger: each awaited entry is written within it; a batch still gathers
        # the entries added without waiting.)
        bounds = {"max_requests_per_session": max_requests_per_session,
                  "retention_days": retention_days, "audit_linger_s": 0.01}
        if self.backend == "sqlite":
            return await SQLiteStateStore(self.location, max_summaries=max_summaries,
                                          **bounds).open()
        mode = "cluster" if self.backend == "redis-cluster" else "standalone"
        return await RedisStateStore(self.location, mode=mode, max_summaries=max_summaries,
                                     key_prefix=self.key_prefix, **bounds).open()

    async def stored_summary_counts(self) -> tuple[int, ...]:
        """How many entries each of the backend's summary-cache structures holds, read raw."""
        if self.backend == "sqlite":
            conn = sqlite3.connect(self.location)
            try:
                return (conn.execute("SELECT COUNT(*) FROM summary_cache").fetchone()[0],)
            finally:
                conn.close()
        # The text hash and the age index must agree, or entries leak.
        client: aioredis.Redis | RedisCluster = (
            RedisCluster.from_url(self.location) if self.backend == "redis-cluster"
            else aioredis.Redis.from_url(self.location))
        try:
            return (await client.hlen(f"{self.key_prefix}{{summary}}:summary:text"),
                    await client.zcard(f"{self.key_prefix}{{summary}}:summary:order"))
        finally:
            await client.aclose()


# --- the audit log ----------------------------------------------------------------------

NOW = datetime.now(UTC).replace(microsecond=123456)


def entry(index: int, *, session: str = "sess-1", tenant: str = "none",
          blocked: bool = False, at: datetime | None = None) -> RequestEntry:
    """Request entry ``index`` of a session: ``index`` seconds after NOW - 1 h, every field
    set (a refused one has a reason and a hard limit, and no usage)."""
    return RequestEntry(
        at=at or NOW - timedelta(hours=1) + timedelta(seconds=index),
        request_id=f"req-{session}-{index:04d}", session_id=session, tenant=tenant,
        route="messages" if index % 3 else "count_tokens", role="main",
        model="claude-sonnet-4-5", tokens_before=1000 + index, tokens_after=400 + index,
        layers=(LayerSaving("L1", 300), LayerSaving("L3", 300 + index)),
        outcome="blocked" if blocked else "forwarded",
        reason="MessageViewLimitExceeded" if blocked else None,
        hard_limit=800 if blocked else None, status=400 if blocked else 200,
        upstream_status=None if blocked else 200,
        usage_input=None if blocked else 350, usage_cache_read=None if blocked else 40,
        usage_cache_write=None if blocked else 7, usage_output=None if blocked else 12,
        duration_ms=12.5 + index,
    )
