"""Console logouts every process sees, and that outlive a restart.

A console cookie is signed, not stored (:mod:`proxy.admin.console._auth`), so a logout is kept as
the cookie's nonce, revoked until the cookie would have expired anyway; every worker and
replica reading the same store refuses it from then on, after a restart too. Each backend
keeps them apart (:mod:`proxy.store.sqlite.revocations`,
:mod:`proxy.store.redis.revocations`): SQLite's
``console_revoked`` is created on first use, and rows past their expiry are deleted with
each new logout, so it holds at most the logins of the last ``SESSION_TTL_S``.
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
