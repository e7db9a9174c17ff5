"""What every part of the Redis store shares: the client and the lane, the lifecycle, and how
a failure becomes a :class:`~proxy.store.base.StoreError` (an outage: fail fast while a probe
PINGs every :data:`PROBE_INTERVAL_S` until the server answers)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Final, Self

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import RedisClusterException, ResponseError

from proxy.audit.log import (
    DEFAULT_MAX_REQUESTS_PER_SESSION,
    DEFAULT_RETENTION_DAYS,
    RequestEntry,
)

from .._rows import check_bounds, retention_cutoff, utc_now
from ..audit_batches import AUDIT_LINGER_S, AuditBatches
from ..base import CorruptStateError, StoreError, StoreUnavailable
from .client import FAILURES, OUTAGES, Failure, RedisMode, make_client, redacted_url
from .keys import RedisKeys, as_score, pair_member
from .lane import Lane

__all__ = ["HEALTH_TTL_S", "PROBE_INTERVAL_S", "PROBE_TIMEOUT_S", "RedisConnection"]

#: While the server is unreachable, how often a probe PINGs it (seconds).
PROBE_INTERVAL_S: Final = 0.5
#: How long a probe's PING may take (seconds).
PROBE_TIMEOUT_S: Final = 1.0
#: How long :meth:`RedisStateStore.available` reuses its last PING (seconds).
HEALTH_TTL_S: Final = 1.0


class RedisConnection(RedisKeys):
    """What every part of :class:`~proxy.store.RedisStateStore` works on (arguments there)."""

    if TYPE_CHECKING:
        async def _write_requests(self, batch: list[RequestEntry]) -> None: ...

    def __init__(self, url: str, *, mode: RedisMode = "standalone",
                 sentinel_service: str | None = None, max_summaries: int = 1000,
                 key_prefix: str = "compact-proxy:", timeout_s: float = 5.0,
                 max_requests_per_session: int = DEFAULT_MAX_REQUESTS_PER_SESSION,
                 retention_days: int = DEFAULT_RETENTION_DAYS,
                 audit_linger_s: float = AUDIT_LINGER_S) -> None:
        check_bounds(max_summaries, max_requests_per_session, retention_days)
        self.max_requests_per_session = max_requests_per_session
        self.retention_days = retention_days
        if not key_prefix:
            raise ValueError("key_prefix must not be empty")
        if "{" in key_prefix or "}" in key_prefix:
            raise ValueError("key_prefix must not hold { or } (the hash tags' braces)")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.url = redacted_url(url)
        self.max_summaries = max_summaries
        super().__init__(key_prefix)
        self.mode = mode
        try:
            self._redis = make_client(url, mode, sentinel_service, timeout_s)
        except ValueError as exc:
            # redis-py's messages name the scheme or option, never the URL itself.
            raise ValueError(f"invalid redis url {self.url}: {exc}") from None
        # The scripts every request runs go by a lane (not in a cluster: see .lane).
        self._lane = (Lane(self._redis.connection_pool)
                      if isinstance(self._redis, aioredis.Redis) else None)
        # The scripts (.scripts), registered on first use, by their text.
        self._scripts: dict[str, AsyncScript] = {}
        self._closed = False
        # Audit entries waiting for their batch's write (used from the event loop only).
        self._batches = AuditBatches(self._write_requests, linger_s=audit_linger_s)
        # Why the server is unreachable (None: not known to be); while set, calls fail fast.
        self._down: str | None = None
        self._probe: asyncio.Task[None] | None = None
        self._health: tuple[float, bool] | None = None  # (when, answered) of the last PING

    async def open(self) -> Self:
        """PING the server now; returns the store itself (:class:`StoreError`, the store
        closed, when the server does not answer or refuses the credentials)."""
        try:
            self._check_open()
            await self._redis.ping()
        except FAILURES as exc:
            await self.close()
            raise self._error("connect", exc) from None
        except BaseException:
            await self.close()
            raise
        return self

    async def available(self) -> bool:
        """Whether the server answers now (``/healthz``): ``False`` while it is known to be
        unreachable, else a PING whose answer is reused for :data:`HEALTH_TTL_S`."""
        if self._closed or self._down is not None:
            return False
        now = asyncio.get_running_loop().time()
        if self._health is not None and now - self._health[0] < HEALTH_TTL_S:
            return self._health[1]
        answered = await self._ping()
        self._health = (asyncio.get_running_loop().time(), answered)
        if not answered:
            self._mark_down(f"redis store {self.url}: no answer to PING")
        return answered

    @property
    def client(self) -> aioredis.Redis | RedisCluster:
        """The redis-py client, for maintenance (:mod:`proxy.sources.migrate`)."""
        return self._redis

    async def close(self) -> None:
        """Close the connection pool; idempotent. Later calls raise :class:`StoreError`."""
        if self._closed:
            return
        try:
            await self._batches.flush()  # the audit entries gathered for a batch: written now
        finally:
            self._closed = True
            if self._probe is not None:
                self._probe.cancel()
            if self._lane is not None:
                await self._lane.close()
            await self._redis.aclose()

    def _check_open(self) -> None:
        """Called first by every method: a closed store raises :class:`StoreError`, and one
        whose server is known to be unreachable :class:`StoreUnavailable`, at once."""
        if self._closed:
            raise StoreError(f"redis store {self.url} is closed")
        if self._down is not None:
            raise StoreUnavailable(self._down)

    @contextlib.contextmanager
    def _failures(self, action: str, error: Callable[[str, Failure], StoreError] | None = None
                  ) -> Iterator[None]:
        """:meth:`_check_open`, then what redis-py raises in the block as the
        :class:`StoreError` ``error`` makes of it (default :meth:`_error`; e.g.
        :meth:`_audit_error`: a key of the audit log holding something else is corrupt)."""
        self._check_open()
        try:
            yield
        except FAILURES as exc:
            raise (error or self._error)(action, exc) from exc

    def _error(self, action: str, exc: Failure) -> StoreError:
        # redis-py's messages name the host and the failure, never the URL's password.
        message = f"redis store {self.url}: cannot {action}: {exc}"
        if isinstance(exc, OUTAGES) or (isinstance(exc, RedisClusterException)
                                         and "slot" not in str(exc)):
            self._mark_down(message)
            return StoreUnavailable(message)
        return StoreError(message)

    def _mark_down(self, why: str) -> None:
        """Fail fast from now on, until a probe's PING is answered."""
        self._down = why
        self._health = None
        if not self._closed and (self._probe is None or self._probe.done()):
            self._probe = asyncio.get_running_loop().create_task(self._probe_until_up())

    async def _probe_until_up(self) -> None:
        while not self._closed:
            await asyncio.sleep(PROBE_INTERVAL_S)
            if await self._ping():
                self._down = None
                return

    async def _ping(self) -> bool:
        """Whether the server answers a PING within :data:`PROBE_TIMEOUT_S`."""
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                await self._redis.ping()
        except (*FAILURES, TimeoutError, OSError):
            return False
        return True

    def _bounds(self) -> tuple[int, str]:
        """How many audit entries a session keeps, and the oldest score one may have now."""
        return (self.max_requests_per_session,
                as_score(retention_cutoff(utc_now(), self.retention_days)))

    def _audit_error(self, action: str, exc: Failure) -> StoreError:
        if isinstance(exc, ResponseError) and ("WRONGTYPE" in str(exc)
                                               or "cjson" in str(exc).lower()):
            return CorruptStateError("<audit log>", f"cannot {action}: a key does not hold "
                                     "what the audit log keeps there")
        return self._error(action, exc)

    def _state_error(self, session_id: str, action: str, exc: Failure) -> StoreError:
        if isinstance(exc, ResponseError) and str(exc).startswith("WRONGTYPE"):
            return CorruptStateError(session_id, "the state key is not a hash")
        return self._error(action, exc)

    def _script(self, text: str) -> AsyncScript:
        """The redis-py script object of ``text`` (sent by its SHA, loaded when the server
        does not hold it)."""
        script = self._scripts.get(text)
        if script is None:
            script = self._scripts[text] = self._redis.register_script(text)
        return script

    async def _index_changed(self, tenant: str, session_id: str, score: str | None) -> None:
        """Put the session in the index of sessions with changes at ``score``, its newest
        change's (``None``: it has none left)."""
        key = self.change_key(tenant, session_id)

        async def newest() -> str | None:
            found = await self._redis.zrange(key, -1, -1, withscores=True)
            return repr(float(found[0][1])) if found else None

        await self._index(self.audit_changed_key, pair_member(tenant, session_id), score, newest)

    async def _index(self, index: str, member: str, score: str | None,
                     current: Callable[[], Awaitable[str | None]]) -> None:
        """Put ``member`` in the global sorted set ``index`` at ``score`` (only ever raised),
        or out when ``None``; a racing write of the session may have indexed it just before
        the ZREM, so ``current()`` (its score now) is asked again after it."""
        if score is None:
            await self._redis.zrem(index, member)
            score = await current()
            if score is None:
                return
        await self._redis.zadd(index, {member: score}, gt=True)
