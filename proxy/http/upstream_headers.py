"""The client headers the provider never sees, besides the hop-by-hop ones.

- The proxy's own: the session header (``session.header``), the header ``session.scope:
  header:<name>`` takes the tenant from, and every ``x-compact-*``: the proxy consumed them.
- What describes the way to the proxy, not the request: ``Cookie`` (the console's, or a
  browser's), ``Forwarded``, ``X-Forwarded-*`` and ``X-Real-IP`` (set by a front proxy).
- The admin token: an ``Authorization`` or ``x-api-key`` carrying it is dropped, so a caller
  who sends it (by mistake, or to a near-miss of ``/admin``) never has it forwarded.

Everything else goes as sent: ``x-api-key``, ``Authorization``, ``anthropic-*``,
``user-agent``, ``x-stainless-*``, ``X-Claude-Code-Session-Id`` and any header of the
client's own, which the provider (or a gateway in front of it) may need.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Final

from multidict import CIMultiDict

from proxy.config import Config

__all__ = ["ForwardPolicy"]

#: Dropped whatever the configuration.
_ALWAYS_DROPPED: Final = frozenset({"cookie", "forwarded", "x-real-ip"})
#: Dropped by prefix (lower-case).
_DROPPED_PREFIXES: Final = ("x-forwarded-", "x-compact-")
#: The headers that may carry a credential.
_CREDENTIALS: Final = ("authorization", "x-api-key")


@dataclass(frozen=True, slots=True)
class ForwardPolicy:
    """Which client headers are not forwarded.

    Attributes:
        dropped: lower-case names dropped outright.
        admin_token: the admin token (UTF-8), or ``None`` when the admin API is off.
    """

    dropped: frozenset[str] = _ALWAYS_DROPPED
    admin_token: bytes | None = None

    @classmethod
    def from_config(cls, config: Config) -> ForwardPolicy:
        """The policy of a config: its session and tenant headers, its admin token."""
        names = {config.session.header.lower()}
        kind, _, header = config.session.effective_scope.partition(":")
        if kind == "header":
            names.add(header.lower())
        token = config.admin_token()
        return cls(_ALWAYS_DROPPED | names, token.encode("utf-8") if token else None)

    def apply(self, headers: CIMultiDict[str]) -> None:
        """Remove from ``headers`` (in place) what the provider must not see (C loops over
        the names: this runs on every request)."""
        joined = "\n" + "\n".join(headers.keys()).lower()
        lowered = joined.split("\n")
        names = set(self.dropped.intersection(lowered))
        if any(f"\n{prefix}" in joined for prefix in _DROPPED_PREFIXES):
            names.update(name for name in lowered if name.startswith(_DROPPED_PREFIXES))
        if self.admin_token is not None:
            for name in _CREDENTIALS:
                if any(self._is_admin_token(name, value) for value in headers.getall(name, ())):
                    names.add(name)
        for name in names:
            headers.popall(name, None)

    def _is_admin_token(self, name: str, value: str) -> bool:
        assert self.admin_token is not None
        if name == "authorization":
            scheme, _, value = value.strip().partition(" ")
            if scheme.lower() != "bearer":
                return False
        given = value.strip().encode("utf-8", "surrogateescape")
        return hmac.compare_digest(given, self.admin_token)


