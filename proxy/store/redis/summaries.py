"""The Redis store's summary cache (:class:`~proxy.store.base.SummaryCache`): a hash
of texts, a sorted set of their ages, and one script that inserts and evicts."""

from __future__ import annotations

from ..base import CorruptStateError
from . import scripts
from .connection import RedisConnection
from .keys import as_bytes

__all__ = ["RedisSummaries"]


class RedisSummaries(RedisConnection):
    """:class:`~proxy.store.base.SummaryCache` on Redis."""

    async def get_summary(self, key: str) -> str | None:
        with self._failures("read summary"):
            raw = await self._redis.hget(self._summary_keys[0], key)
        text = as_bytes(raw)
        if text is None:
            return None
        try:
            return text.decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptStateError(f"<summary {key}>", "summary text is not UTF-8") from None

    async def put_summary(self, key: str, text: str) -> None:
        with self._failures("write summary"):
            await self._script(scripts.PUT_SUMMARY)(keys=self._summary_keys,
                                                    args=[key, text, self.max_summaries])
