"""The Redis store's opaque per-session records (:class:`~proxy.store.base.RecordStore`):
one hash per session, ``kind -> bytes``."""

from __future__ import annotations

from .connection import RedisConnection
from .keys import as_bytes

__all__ = ["RedisRecords"]


class RedisRecords(RedisConnection):
    """:class:`~proxy.store.base.RecordStore` on Redis."""

    async def get_record(self, session_id: str, kind: str) -> bytes | None:
        with self._failures("read record"):
            raw = await self._redis.hget(self.record_key(session_id), kind)
        return as_bytes(raw)

    async def put_record(self, session_id: str, kind: str, data: bytes) -> None:
        with self._failures("write record"):
            await self._redis.hset(self.record_key(session_id), kind, bytes(data))
