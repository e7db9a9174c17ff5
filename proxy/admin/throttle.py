"""Failed-auth throttling for the admin API and the console login.

Each client address (an IPv6 address by its /64, which one host commonly holds whole) may
present ``limit`` wrong admin tokens; the next wrong one locks it out for ``lockout_s``,
and every wrong one after a lockout ends locks it again for twice as long, up to
``max_lockout_s``. While locked out, the client's admin calls and login attempts are refused
with 429 and ``Retry-After`` before its token is even looked at; a right token once the
lockout is over resets its count. A client quiet for :data:`FORGET_AFTER_S` (or twice the
longest lockout, if longer) starts afresh.

The table is bounded: at most ``max_clients`` addresses, the least recently used (failed or
checked) dropped first. Each serving process keeps its own table (with ``listen.workers`` N,
a client gets N times the tries); behind a proxy that terminates connections every client shares its
address, so there one attacker can lock the operator out: the admin listener
(``admin.listen``) on an address only operators reach avoids both.
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
    """The per-client failure counts and lockouts (see the module's docstring).

    Args:
        limit: wrong tokens a client may present before its first lockout.
        lockout_s: the first lockout; each one in a row doubles it.
        max_lockout_s: the longest lockout.
        max_clients: addresses remembered at most.
        clock: monotonic seconds (tests pass their own).
    """

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
        """Count a wrong token of ``client``; the lockout (whole seconds) it now starts, if
        any."""
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
