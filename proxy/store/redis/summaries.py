"""The Redis store's summary cache (:class:`~proxy.store.base.SummaryCache`): a hash
of texts, a sorted set of their ages, and one script that inserts and evicts."""

from __future__ import annotations

from ..base import CorruptStateError
from . import scripts
from .client import FAILURES
from .connection import RedisConnection
from .keys import as_bytes

__all__ = ["RedisSummaries"]


class RedisSummaries(RedisConnection):
    """:class:`~proxy.store.base.SummaryCache` on Redis."""

    async def get_summary(self, key: str) -> str | None:
        """Return the cached summary stored under ``key``, or ``None``."""
        self._check_open()
        try:
            raw = await self._redis.hget(self._summary_keys[0], key)
        except FAILURES as exc:
            raise self._error("read summary", exc) from exc
        text = as_bytes(raw)
        if text is None:
            return None
        try:
            return text.decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptStateError(f"<summary {key}>", "summary text is not UTF-8") from None

    async def put_summary(self, key: str, text: str) -> None:
        """Cache ``text`` under ``key``, evicting the oldest entries beyond ``max_summaries``."""
        self._check_open()
        try:
            await self._script(scripts.PUT_SUMMARY)(keys=self._summary_keys,
                                           args=[key, text, self.max_summaries])
        except FAILURES as exc:
            raise self._error("write summary", exc) from exc
