"""The Redis store's usage ledger (:class:`~proxy.store.base.UsageLedger`): one hash of
counters per ``(session key, model)``, added to by one script, and a set indexing them."""

from __future__ import annotations

from redis.exceptions import ResponseError

from proxy.accounting.usage import UsageEntry, UsageRow

from .._rows import check_type, decode_usage_row, usage_stamp
from ..base import CorruptStateError
from . import scripts
from .client import FAILURES
from .connection import RedisConnection
from .keys import as_text, pair_member, pair_of

__all__ = ["RedisLedger"]


class RedisLedger(RedisConnection):
    """:class:`~proxy.store.base.UsageLedger` on Redis."""

    async def add_usage(self, session_key: str, model: str, entry: UsageEntry) -> None:
        check_type("entry", entry, UsageEntry)
        self._check_open()
        args: list[str | int] = [usage_stamp()]
        for name in UsageEntry.field_names():
            args += [name, getattr(entry, name)]
        try:
            # The index first: a row it lists but that is not written is left out by
            # usage_rows, while a row written but not listed would be lost to it.
            await self._redis.sadd(self.usage_index_key, pair_member(session_key, model))
            await self._script(scripts.ADD_USAGE)(
                keys=[self.usage_key(session_key, model)], args=args)
        except FAILURES as exc:
            if isinstance(exc, ResponseError) and "WRONGTYPE" in str(exc):
                raise CorruptStateError(session_key, "the usage key is not a hash") from None
            if isinstance(exc, ResponseError) and "not an integer" in str(exc):
                raise CorruptStateError(session_key, "a usage counter is not an integer"
                                        ) from None
            raise self._error("add usage", exc) from exc

    async def usage_rows(self) -> list[UsageRow]:
        """A row in the index whose hash is gone (deleted by hand) is left out."""
        with self._failures("read usage"):
            members = await self._redis.smembers(self.usage_index_key)
            pairs = sorted(pair_of(member, "<usage index>") for member in members)
            async with self._redis.pipeline(transaction=False) as pipe:
                for session_key, model in pairs:
                    pipe.hgetall(self.usage_key(session_key, model))
                hashes = await pipe.execute()
        rows = []
        for (session_key, model), raw in zip(pairs, hashes, strict=True):
            if not raw:
                continue
            counters = {as_text(name): value for name, value in raw.items()}
            rows.append(decode_usage_row(session_key, model, counters,
                                         counters.get("last_seen")))
        return rows
