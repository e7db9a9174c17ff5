"""Audit entries gathered for a moment and written as one batch, by either store.

Nobody waits for a request's audit entry, and written one by one each would be a transaction
or a round trip (bench/README.md). :class:`AuditBatches` gathers the entries added within
:data:`AUDIT_LINGER_S` of the first, or while a write is under way, into batches of at most
:data:`MAX_AUDIT_BATCH`, each with one future every entry of it is handed. The store's own
reads :meth:`~AuditBatches.flush` first. Used from the event loop only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Final

from proxy.audit.log import RequestEntry

__all__ = ["AUDIT_LINGER_S", "MAX_AUDIT_BATCH", "AuditBatches"]

#: The most request entries written at once.
MAX_AUDIT_BATCH: Final = 256
#: How long the first of a batch of request entries waits for others to join it (seconds).
AUDIT_LINGER_S: Final = 1.0


class AuditBatches:
    """Request entries waiting for their batch's ``write`` (in the store's way), which raises
    what the batch's callers are to be told."""

    def __init__(self, write: Callable[[list[RequestEntry]], Awaitable[None]], *,
                 linger_s: float = AUDIT_LINGER_S) -> None:
        if not linger_s >= 0:
            raise ValueError(f"linger_s must be >= 0, got {linger_s}")
        self._write = write
        self._linger_s = linger_s
        # Each batch with the one future its callers are handed, and the task that writes them.
        self._pending: list[tuple[list[RequestEntry], asyncio.Future[None]]] = []
        self._writer: asyncio.Task[None] | None = None

    def add(self, entry: RequestEntry) -> asyncio.Future[None]:
        """Put ``entry`` in the open batch (a new one when there is none, it is full, or its
        callers gave up on it); returns the batch's future."""
        loop = asyncio.get_running_loop()
        pending = self._pending
        if (not pending or len(pending[-1][0]) >= MAX_AUDIT_BATCH
                or pending[-1][1].done() or pending[-1][1].get_loop() is not loop):
            # (a caller that gave up on its batch cancelled the batch's future: a new one)
            pending.append(([], loop.create_future()))
        entries, written = pending[-1]
        entries.append(entry)
        writer = self._writer
        if writer is None or writer.done() or writer.get_loop() is not loop:
            self._writer = loop.create_task(self._write_later())
        return written

    async def _write_later(self) -> None:
        try:
            await asyncio.sleep(self._linger_s)
            await self.flush()
        finally:
            if self._writer is asyncio.current_task():
                self._writer = None

    async def flush(self) -> None:
        """Write the pending batches now, one write each, until none are left."""
        while self._pending:
            entries, written = self._pending.pop(0)
            failure: Exception | None = None
            try:
                await self._write(entries)
            except Exception as exc:  # noqa: BLE001 - handed to the batch's callers
                failure = exc
            # A caller that gave up (or whose loop is gone) is not told.
            if written.done() or written.get_loop() is not asyncio.get_running_loop():
                continue
            if failure is None:
                written.set_result(None)
            else:
                written.set_exception(failure)
