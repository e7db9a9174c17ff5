"""Console logouts in Redis (:mod:`proxy.store.revocations`): one key per revoked
login, ``<prefix>{console}:console:revoked:<nonce>``, expiring with the cookie it refuses
(``SET … EX``), so nothing needs trimming."""

from __future__ import annotations

import time

from .connection import RedisConnection

__all__ = ["RedisLoginRevocations"]


class RedisLoginRevocations(RedisConnection):
    """:class:`~proxy.store.revocations.LoginRevocations` on Redis."""

    def revoked_login_key(self, nonce: str) -> str:
        """The key of one revoked login (every one in the ``{console}`` slot)."""
        return self._key("console", f"console:revoked:{nonce}")

    async def revoke_login(self, nonce: str, expires_at: int) -> None:
        ttl = int(expires_at) - int(time.time())
        if ttl <= 0:
            return
        with self._failures("revoke login"):
            await self._redis.set(self.revoked_login_key(nonce), b"1", ex=ttl)

    async def login_revoked(self, nonce: str) -> bool:
        with self._failures("read revoked logins"):
            return bool(await self._redis.exists(self.revoked_login_key(nonce)))
