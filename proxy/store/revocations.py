"""Console logouts every process sees, and that outlive a restart.

A console cookie is signed, not stored (:mod:`proxy.admin.console._auth`), so a logout keeps the
cookie's nonce, refused until the cookie would have expired anyway, in the store every worker
and replica reads (:mod:`proxy.store.sqlite.revocations`, :mod:`proxy.store.redis.revocations`).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["LoginRevocations"]


@runtime_checkable
class LoginRevocations(Protocol):
    """Where revoked console logins are kept."""

    async def revoke_login(self, nonce: str, expires_at: int) -> None:
        """Refuse the login ``nonce`` until ``expires_at`` (Unix seconds)."""

    async def login_revoked(self, nonce: str) -> bool:
        """Whether the login ``nonce`` was revoked (and has not expired since)."""
