"""The client headers the provider never sees, besides the hop-by-hop ones: the proxy's own
(the session and tenant headers, ``x-compact-*``), what describes the way to the proxy
(``Cookie``, ``Forwarded``, ``X-Forwarded-*``, ``X-Real-IP``) and an ``Authorization`` or
``x-api-key`` carrying the admin token. Everything else goes as sent.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Final

from multidict import CIMultiDict

from proxy.config import Config

__all__ = ["ForwardPolicy"]

_ALWAYS_DROPPED: Final = frozenset({"cookie", "forwarded", "x-real-ip"})
_DROPPED_PREFIXES: Final = ("x-forwarded-", "x-compact-")
_CREDENTIALS: Final = ("authorization", "x-api-key")


@dataclass(frozen=True, slots=True)
class ForwardPolicy:
    """Which client headers are not forwarded: lower-case names ``dropped`` outright, and a
    credential holding ``admin_token`` (``None``: the admin API is off)."""

    dropped: frozenset[str] = _ALWAYS_DROPPED
    admin_token: bytes | None = None

    @classmethod
    def from_config(cls, config: Config) -> ForwardPolicy:
        names = {config.session.header.lower()}
        kind, _, header = config.session.effective_scope.partition(":")
        if kind == "header":
            names.add(header.lower())
        token = config.admin_token()
        return cls(_ALWAYS_DROPPED | names, token.encode("utf-8") if token else None)

    def apply(self, headers: CIMultiDict[str]) -> None:
        """Remove from ``headers`` (in place) what the provider must not see."""
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
