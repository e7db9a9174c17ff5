"""The Redis store's opaque per-session records (:class:`~proxy.store.base.RecordStore`):
one hash per session, ``kind -> bytes``."""

from __future__ import annotations

from .client import FAILURES
from .connection import RedisConnection
from .keys import as_bytes

__all__ = ["RedisRecords"]


class RedisRecords(RedisConnection):
    """:class:`~proxy.store.base.RecordStore` on Redis."""

    async def get_record(self, session_id: str, kind: str) -> bytes | None:
        """Return the opaque compaction record ``kind`` of the session, or ``None``."""
        self._check_open()
        try:
            raw = await self._redis.hget(self.record_key(session_id), kind)
        except FAILURES as exc:
            raise self._error("read record", exc) from exc
        return as_bytes(raw)

    async def put_record(self, session_id: str, kind: str, data: bytes) -> None:
        """Store (replace) the opaque compaction record ``kind`` of the session."""
        self._check_open()
        try:
            await self._redis.hset(self.record_key(session_id), kind, bytes(data))
        except FAILURES as exc:
            raise self._error("write record", exc) from exc
