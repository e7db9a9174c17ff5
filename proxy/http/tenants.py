"""Whose sessions a request's are: its tenant (``session.scope``, docs/operations.md).

Every per-session thing (durable state, checkpoints, summary cache entries) is kept under the
tenant as well, so a client-chosen session id never reaches another caller's state:
``credential`` (``t`` + an HMAC of the caller's key), ``header:<name>`` (``h`` + a hash of a
front proxy's header) or ``none`` (one tenant, whose keys are the bare session ids).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from proxy.config import ConfigError, SessionConfig

__all__ = ["NO_TENANT", "TenantScope", "is_tenant", "scoped_key"]

NO_TENANT: Final = "none"
#: The scheme of an AWS SigV4 ``Authorization`` (a Bedrock client that signs itself).
_SIGV4: Final = "AWS4-HMAC-SHA256 "
_TENANT: Final = re.compile(r"none|[th][0-9a-f]{16}")


def is_tenant(value: str) -> bool:
    """Whether ``value`` has the form of a tenant (``none``, ``t<16 hex>``, ``h<16 hex>``)."""
    return _TENANT.fullmatch(value) is not None


def scoped_key(tenant: str, session_id: str) -> str:
    """The store key of a tenant's session: the bare id for ``none``, else ``tenant/id``."""
    return session_id if tenant == NO_TENANT else f"{tenant}/{session_id}"


@dataclass(frozen=True)
class TenantScope:
    """``session.scope`` with its secret, ready to tell a request's tenant."""

    scope: str
    secret: bytes | None = None

    @classmethod
    def from_config(cls, session: SessionConfig,
                    environ: Mapping[str, str] = os.environ) -> TenantScope:
        """The scope of a config; ConfigError for ``credential`` without its secret."""
        secret = environ.get(session.secret_env, "")
        if session.effective_scope == "credential" and not secret:
            raise ConfigError("session.secret_env", (
                f"the environment variable {session.secret_env} is unset or empty; "
                "session.scope credential keys tenants by a secret"))
        return cls(session.effective_scope, secret.encode() if secret else None)

    def _digest(self, value: str) -> str:
        if self.secret is None:
            return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        return hmac.new(self.secret, value.encode("utf-8", "surrogatepass"),
                        hashlib.sha256).hexdigest()[:16]

    def credential_tenant(self, credential: str) -> str:
        """The tenant of an ``x-api-key`` or ``Authorization`` value (``Bearer`` dropped)."""
        scheme, _, token = credential.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            credential = token
        return "t" + self._digest(credential.strip())

    def header_tenant(self, value: str) -> str:
        """The tenant of a front proxy's header value."""
        return "h" + self._digest(value.strip())

    def tenant_of(self, headers: Mapping[str, str]) -> str:
        """The tenant of a request; RequestRejected 401 without the credential or header."""
        if self.scope == "none":
            return NO_TENANT
        # Imported here: the CLI's audit and move commands use this module without the
        # request path (whose imports bring in the anthropic SDK, seconds per command).
        from proxy.http.errors import RequestRejected
        if self.scope == "credential":
            credential = headers.get("x-api-key") or headers.get("authorization")
            if not credential:
                raise RequestRejected(
                    401, "authentication_error",
                    "x-api-key or Authorization header is required (session.scope credential)",
                    reason="no_credential")
            if credential.startswith(_SIGV4):
                # Its access key id is no secret: anyone could claim another's tenant.
                raise RequestRejected(
                    401, "authentication_error",
                    "session.scope credential cannot take a tenant from a SigV4 signature "
                    "(its access key id is not secret): send a Bedrock API key, or use "
                    "session.scope header:<name> behind an authenticating proxy",
                    reason="no_credential")
            return self.credential_tenant(credential)
        name = self.scope.partition(":")[2]
        value = headers.get(name, "")
        if not value.strip():
            raise RequestRejected(
                401, "authentication_error",
                f"the {name} header is required (session.scope header:{name}); Claude Code "
                f"sends it with ANTHROPIC_CUSTOM_HEADERS=\"{name}: <name>\"",
                reason="no_tenant_header")
        return self.header_tenant(value)
