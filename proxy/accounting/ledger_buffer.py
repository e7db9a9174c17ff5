"""Usage-ledger additions summed in memory and written to the store once in a while.

Entries are sums, so :meth:`BufferedLedger.add` holds them per (session, model) and a task
writes the totals every :data:`FLUSH_INTERVAL_S` instead of a transaction per request. A failed
write keeps its totals for the next; a crash loses at most the last interval's figures (the
ledger is a report, not durable context).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

import structlog

from proxy.accounting.usage import UsageEntry, UsageRow
from proxy.store import StoreUnavailable, UsageLedger

__all__ = ["FLUSH_INTERVAL_S", "BufferedLedger"]

_log = structlog.get_logger("proxy.accounting.ledger_buffer")

#: How long additions wait before they are written (seconds).
FLUSH_INTERVAL_S: Final = 1.0
#: Entries of one (session, model) held before they are summed into one.
MAX_HELD: Final = 64


class BufferedLedger:
    """A :class:`UsageLedger` in front of another, summing additions between writes."""

    def __init__(self, ledger: UsageLedger, *, interval_s: float = FLUSH_INTERVAL_S,
                 unavailable: Callable[[str, BaseException], None] | None = None) -> None:
        self._ledger = ledger
        self._interval_s = interval_s
        # Told when a flush stops because the store is unreachable (instead of a warning).
        self._unavailable = unavailable
        self._pending: dict[tuple[str, str], list[UsageEntry]] = {}
        self._writer: asyncio.Task[None] | None = None

    def add(self, session_key: str, model: str, entry: UsageEntry) -> None:
        """Add ``entry`` to the row of (``session_key``, ``model``); written within the
        interval. Call from the event loop."""
        self._hold((session_key, model), entry)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write_later())

    def _hold(self, key: tuple[str, str], entry: UsageEntry) -> None:
        held = self._pending.get(key)
        if held is None:
            self._pending[key] = [entry]
            return
        held.append(entry)
        if len(held) >= MAX_HELD:  # (held in memory: summed now and then, not per request)
            held[:] = [UsageEntry.total(held)]

    async def add_usage(self, session_key: str, model: str, entry: UsageEntry) -> None:
        """:meth:`add`, as the :class:`UsageLedger` protocol has it."""
        self.add(session_key, model, entry)

    async def usage_rows(self) -> list[UsageRow]:
        """The store's rows, once everything added so far is written."""
        await self.flush()
        return await self._ledger.usage_rows()

    async def _write_later(self) -> None:
        await asyncio.sleep(self._interval_s)
        await self.flush()

    async def flush(self) -> None:
        """Write every pending total now; a total whose write fails is kept for the next.
        While the store is unreachable, stop at the first failure, keep all, report once."""
        pending = {key: UsageEntry.total(held) for key, held in self._pending.items()}
        self._pending = {}
        for (session_key, model), entry in list(pending.items()):
            try:
                await self._ledger.add_usage(session_key, model, entry)
                del pending[session_key, model]
            except StoreUnavailable as exc:
                if self._unavailable is not None:
                    self._unavailable("usage", exc)
                else:
                    _log.warning("usage_not_recorded", error_class=type(exc).__name__)
                for key, kept in pending.items():
                    self._hold(key, kept)
                return
            except Exception as exc:  # noqa: BLE001 - bookkeeping never fails a request
                del pending[session_key, model]
                _log.warning("usage_not_recorded", error_class=type(exc).__name__)
                self._hold((session_key, model), entry)

    async def close(self) -> None:
        """Stop the timer and write what is pending."""
        if self._writer is not None and not self._writer.done():
            self._writer.cancel()
        await self.flush()
