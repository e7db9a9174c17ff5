"""Console logouts in Redis (:mod:`proxy.store.revocations`): one key per revoked
login, ``<prefix>{console}:console:revoked:<nonce>``, expiring with the cookie it refuses
(``SET … EX``), so nothing needs trimming."""

from __future__ import annotations

import time

from .client import FAILURES
from .connection import RedisConnection

__all__ = ["RedisLoginRevocations"]


class RedisLoginRevocations(RedisConnection):
    """:class:`~proxy.store.revocations.LoginRevocations` for
    :class:`~proxy.store.RedisStateStore` (a mixin over its connection)."""

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
        except FAILURES as exc:
            raise self._error("revoke login", exc) from exc

    async def login_revoked(self, nonce: str) -> bool:
        """One ``EXISTS``."""
        self._check_open()
        try:
            return bool(await self._redis.exists(self.revoked_login_key(nonce)))
        except FAILURES as exc:
            raise self._error("read revoked logins", exc) from exc
