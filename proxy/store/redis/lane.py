"""Connections of the Redis store's own for the two scripts every request runs.

A :class:`Lane` sends a command on one of redis-py's own connections, packed by hiredis, without
the client's pool lock, metrics and per-command task (bench/README.md, "The stores' twins"),
keeping what the client guarantees: a timeout per call (never retried), one retry on a
connection error, a failed connection closed before reuse, redis-py's exceptions. Sentinel
mode follows a failover as redis-py does; a cluster keeps the client's path. Event loop only.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any, Final

from hiredis import pack_command
from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["MAX_IDLE", "Lane"]

#: Idle connections a lane keeps; more (after a burst) are closed when they come back.
MAX_IDLE: Final = 32


class Lane:
    """Send single commands on connections like ``pool``'s (its connection class and
    settings), without its bookkeeping; its socket timeout bounds each whole call."""

    def __init__(self, pool: ConnectionPool, *, max_idle: int = MAX_IDLE) -> None:
        settings = dict(pool.connection_kwargs)
        self.timeout_s: float | None = settings.get("socket_timeout")
        settings["socket_timeout"] = None  # the lane bounds the whole call instead
        self._make: Callable[[], AbstractConnection] = functools.partial(
            pool.connection_class, **settings)
        self._idle: list[AbstractConnection] = []
        self._max_idle = max_idle
        self._closed = False

    @property
    def idle(self) -> int:
        """How many idle connections the lane holds."""
        return len(self._idle)

    async def call(self, *args: str | int | bytes) -> Any:
        """Send the command ``args`` (name first) and return the server's reply; raises
        redis-py's exceptions (a timeout, a connection error twice, the server's error)."""
        if self._closed:
            raise RuntimeError("the lane is closed")
        packed = pack_command(args)  # type: ignore[arg-type]  # (its stub says a 1-tuple)
        try:
            return await self._once(packed)
        except RedisConnectionError:
            return await self._once(packed)  # once more, on a connection made anew

    async def _once(self, packed: Any) -> Any:
        connection = self._idle.pop() if self._idle else self._make()
        try:
            if not connection.is_connected:
                # Its own connect (a Sentinel-managed one asks for the primary first), the
                # handshake's replies bounded as the command's are.
                async with asyncio.timeout(self.timeout_s):
                    await connection.connect()  # type: ignore[no-untyped-call]
            async with asyncio.timeout(self.timeout_s):
                await connection.send_packed_command(packed, check_health=False)
                return await connection.read_response()
        except TimeoutError:  # (asyncio's: redis-py closed the connection on the cancel)
            raise RedisTimeoutError(f"no reply within {self.timeout_s} s") from None
        finally:
            if self._closed or len(self._idle) >= self._max_idle:
                await connection.disconnect(nowait=True)
            else:
                self._idle.append(connection)

    async def close(self) -> None:
        """Close the idle connections (one in use is closed when it comes back); idempotent."""
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            await connection.disconnect(nowait=True)
