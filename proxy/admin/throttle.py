"""Failed-auth throttling for the admin API and the console login (docs/admin.md).

Each client address (an IPv6 one by its /64, which one host commonly holds whole) may present
``limit`` wrong tokens; each lockout after that doubles, up to ``max_lockout_s``. A right token
once the lockout is over resets the count, and a client quiet for :data:`FORGET_AFTER_S` (or
twice the longest lockout) starts afresh. Each process keeps its own bounded LRU table.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from aiohttp import web
from cachetools import LRUCache

__all__ = ["AUTH_THROTTLE", "FORGET_AFTER_S", "MAX_CLIENTS", "AuthThrottle", "client_of"]

#: Client addresses remembered at most (a few hundred bytes each).
MAX_CLIENTS: Final = 10_000
#: Seconds after its last failure a client's count is forgotten.
FORGET_AFTER_S: Final = 900.0


@dataclass(slots=True)
class _Client:
    failures: int = 0
    lockouts: int = 0
    locked_until: float = 0.0
    last_failure: float = 0.0


class AuthThrottle:
    """The per-client failure counts and lockouts: ``limit`` wrong tokens before the first
    lockout of ``lockout_s``, each one in a row doubled up to ``max_lockout_s``."""

    def __init__(self, limit: int = 5, lockout_s: float = 1.0, max_lockout_s: float = 300.0,
                 *, max_clients: int = MAX_CLIENTS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if limit < 1 or max_clients < 1 or not 0 < lockout_s <= max_lockout_s:
            raise ValueError("limit and max_clients must be >= 1, 0 < lockout_s <= max_lockout_s")
        self.limit = limit
        self.lockout_s = lockout_s
        self.max_lockout_s = max_lockout_s
        self.max_clients = max_clients
        self._forget_after_s = max(FORGET_AFTER_S, 2 * max_lockout_s)
        self._clock = clock
        self._clients: LRUCache[str, _Client] = LRUCache(max_clients)

    def __len__(self) -> int:
        return len(self._clients)

    def retry_after(self, client: str) -> int | None:
        """Whole seconds ``client`` must wait before its token is checked, or ``None``."""
        entry = self._clients.get(client)
        if entry is None:
            return None
        left = entry.locked_until - self._clock()
        return math.ceil(left) if left > 0 else None

    def failed(self, client: str) -> int | None:
        """Count a wrong token of ``client``; the lockout (whole seconds) it starts, if any."""
        now = self._clock()
        entry = self._clients.pop(client, None)
        if entry is None or now - entry.last_failure > self._forget_after_s:
            entry = _Client()
        self._clients[client] = entry  # (the least recently used goes beyond max_clients)
        entry.failures += 1
        entry.last_failure = now
        if entry.failures < self.limit:
            return None
        lockout = min(self.lockout_s * 2.0 ** entry.lockouts, self.max_lockout_s)
        entry.lockouts += 1
        entry.failures = self.limit - 1  # the next wrong token after this lockout: another
        entry.locked_until = now + lockout
        return math.ceil(lockout)

    def succeeded(self, client: str) -> None:
        """The right token from ``client``: its count starts afresh."""
        self._clients.pop(client, None)


def client_of(request: web.Request) -> str:
    """The throttled unit of a request: its peer address, an IPv6 one by its /64."""
    remote = request.remote or ""
    try:
        address = ipaddress.ip_address(remote)
    except ValueError:
        return remote
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return remote


#: The app's throttle, shared by the admin API and the console (both guess one token).
AUTH_THROTTLE: Final = web.AppKey("auth_throttle", AuthThrottle)
