"""Which callers' credentials the provider has accepted: the operator's summary key is spent
only for them.

In ``summary.mode: separate`` with ``summary.api_key_env`` the operator's key pays for the
summaries, but the provider judges the caller's own credential only when the request is
forwarded, after its summary was made. So a summary call on that key is made only for a
caller whose credential the provider has accepted, known one of two ways:

- from an answer: a forwarded request the provider answered with a 2xx marks its credential
  accepted; a 401 or 403 forgets it (a revoked key spends nothing more after its first
  refusal);
- else checked when a summary call is first needed: ``GET /v1/models?limit=1`` with the
  caller's own credential only (no body, nothing billed, nothing of the operator's). A 2xx
  accepts it; anything else (401, 403, no answer) means no summary call this time, and the
  request goes on without one. Concurrent checks of one credential are one call.

Why not only learn from answers (forward first, deterministic layers only)? A request that
only a summary brings under the hard limit is refused before it is forwarded, so a new caller
with a long history would never be answered, hence never accepted.

Credentials are remembered by a keyed BLAKE2b digest (the key random per process: neither the
credential nor a digest that outlives the process is kept), at most
:data:`MAX_ACCEPTED` of them, each for :data:`ACCEPTED_TTL_S`. Per process: a replica learns
its callers itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

from cachetools import TTLCache

from proxy.state.flights import SingleFlight

if TYPE_CHECKING:
    import anthropic

    from proxy.state.summarizer import CallerCredentials

__all__ = ["ACCEPTED_TTL_S", "MAX_ACCEPTED", "AcceptedCallers"]

#: Accepted credentials remembered (the least recently used go first).
MAX_ACCEPTED: Final = 16384
#: How long an acceptance is trusted without a new answer from the provider.
ACCEPTED_TTL_S: Final = 3600.0

class AcceptedCallers:
    """The credentials the provider has accepted lately (see the module's docstring). Used
    from the event loop only.

    Args:
        client: the summary SDK client (its base URL, timeout and retries), or what gives
            it when a check is first made (the SDK is imported then); a check sends the
            caller's credential in place of the client's own.
        max_entries: how many accepted credentials to remember.
        ttl_s: how long each is remembered.
        timer: the clock of the time to live (tests).
    """

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
