"""Callers' own credentials, and which of them the provider has accepted: the operator's
summary key (``summary.api_key_env``) is spent only for those.

A credential is accepted after a 2xx to a forwarded request (a 401 or 403 forgets it), or after
a ``GET /v1/models?limit=1`` with it when a summary is needed first (a new caller's long
history needs one before it is forwarded). Remembered per process by a keyed BLAKE2b digest.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from cachetools import TTLCache

from proxy.summary.client import sdk
from proxy.summary.flights import SingleFlight

if TYPE_CHECKING:
    import anthropic

__all__ = ["ACCEPTED_TTL_S", "MAX_ACCEPTED", "AcceptedCallers", "CallerCredentials"]

#: Accepted credentials remembered (the least recently used go first).
MAX_ACCEPTED: Final = 16384
#: How long an acceptance is trusted without a new answer from the provider.
ACCEPTED_TTL_S: Final = 3600.0


@dataclass(frozen=True)
class CallerCredentials:
    """The client's own ``x-api-key`` and ``Authorization`` headers, if sent: its summary
    calls send them as they are."""

    x_api_key: str | None = None
    authorization: str | None = None

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> CallerCredentials:
        """Pick the auth headers out of a request's headers."""
        return cls(x_api_key=headers.get("x-api-key") or None,
                   authorization=headers.get("Authorization") or None)

    @property
    def present(self) -> bool:
        """Whether the client sent any credential."""
        return self.x_api_key is not None or self.authorization is not None

    def as_extra_headers(self) -> dict[str, str | anthropic.Omit]:
        """Per-call SDK headers: exactly the caller's, the client's own credential omitted."""
        omit = sdk().omit
        return {
            "X-Api-Key": self.x_api_key if self.x_api_key is not None else omit,
            "Authorization": self.authorization if self.authorization is not None else omit,
        }


class AcceptedCallers:
    """The credentials the provider has accepted lately; used from the event loop only.
    ``client`` is the summary SDK client, or what gives it when a check is first made."""

    def __init__(self, client: anthropic.AsyncAnthropic
                 | Callable[[], Awaitable[anthropic.AsyncAnthropic]], *,
                 max_entries: int = MAX_ACCEPTED,
                 ttl_s: float = ACCEPTED_TTL_S,
                 timer: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._key = os.urandom(32)
        self._accepted: TTLCache[str, bool] = TTLCache(max_entries, ttl_s, timer=timer)
        self._checks: SingleFlight[bool] = SingleFlight()

    def _digest(self, caller: CallerCredentials) -> str | None:
        if not caller.present:
            return None
        hasher = hashlib.blake2b(key=self._key, digest_size=16)
        for part in (caller.x_api_key, caller.authorization):
            hasher.update((part or "").encode("utf-8", "surrogatepass") + b"\0")
        return hasher.hexdigest()

    def answered(self, caller: CallerCredentials, status: int | None) -> None:
        """What the provider's answer to the caller's forwarded request says of it: a 2xx
        accepts its credential, a 401 or 403 forgets it."""
        digest = self._digest(caller)
        if digest is None or status is None:
            return
        if 200 <= status < 300:
            self._accepted[digest] = True
        elif status in (401, 403):
            self._accepted.pop(digest, None)

    async def accepted(self, caller: CallerCredentials) -> bool:
        """Whether the provider has accepted ``caller``'s credential: remembered, or checked
        now (one call per credential at a time; a client that goes away does not cancel it)."""
        digest = self._digest(caller)
        if digest is None:
            return False
        if digest in self._accepted:
            return True
        return await asyncio.shield(self._checks.start(digest, lambda: self._check(caller,
                                                                                  digest)))

    async def _check(self, caller: CallerCredentials, digest: str) -> bool:
        client = await self._client() if callable(self._client) else self._client
        try:
            await client.models.list(limit=1, extra_headers=caller.as_extra_headers())
        except Exception:  # noqa: BLE001 - refused or unanswered: not accepted
            return False
        self._accepted[digest] = True
        return True

    async def close(self) -> None:
        """Cancel the checks still running."""
        await self._checks.close()
