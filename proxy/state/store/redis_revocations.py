"""Console logouts in Redis (:mod:`proxy.state.store.revocations`): one key per revoked
login, ``<prefix>{console}:console:revoked:<nonce>``, expiring with the cookie it refuses
(``SET … EX``), so nothing needs trimming."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisClusterException, RedisError

if TYPE_CHECKING:
    from .base import StoreError

__all__ = ["RedisLoginRevocations"]

_FAILURES = (RedisError, RedisClusterException)


class RedisLoginRevocations:
    """:class:`~proxy.state.store.revocations.LoginRevocations` for
    :class:`~proxy.state.store.RedisStateStore` (a mixin: its client, keys and errors)."""

    if TYPE_CHECKING:
        _redis: Any

        def _key(self, tag: str, suffix: str) -> str: ...
        def _check_open(self) -> None: ...
        def _error(self, action: str, exc: Any) -> StoreError: ...

    def revoked_login_key(self, nonce: str) -> str:
        """The key of one revoked login (every one in the ``{console}`` slot)."""
        return self._key("console", f"console:revoked:{nonce}")

    async def revoke_login(self, nonce: str, expires_at: int) -> None:
        """Keep the revocation until the cookie would have expired."""
        ttl = int(expires_at) - int(time.time())
        if ttl <= 0:
            return
        self._check_open()
        try:
            await self._redis.set(self.revoked_login_key(nonce), b"1", ex=ttl)
        except _FAILURES as exc:
            raise self._error("revoke login", exc) from exc

    async def login_revoked(self, nonce: str) -> bool:
        """One ``EXISTS``."""
        self._check_open()
        try:
            return bool(await self._redis.exists(self.revoked_login_key(nonce)))
        except _FAILURES as exc:
            raise self._error("read revoked logins", exc) from exc
