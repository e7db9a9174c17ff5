"""Whose sessions a request's are: its tenant (``session.scope``).

A proxy in front of several people's agents must never mix their contexts: the session id
comes from a header or the body, which the client chooses, so on its own it would let any
caller read any session's durable state. So every per-session thing — durable state, sticky
checkpoints, summary cache entries — is kept under the request's *tenant* as well:

* ``credential``: ``t`` + 16 hex of HMAC-SHA256(secret, the caller's ``x-api-key``, else its
  ``Authorization`` bearer token: one key is one tenant however it is sent); the secret comes
  from the environment variable named by ``session.secret_env``; the credential itself is
  never stored or logged. A credential that rotates (Claude Code's OAuth tokens refresh
  during long sessions) starts a new tenant: use ``header:<name>`` behind an authenticating
  proxy instead.
* ``header:<name>``: ``h`` + 16 hex of a hash of that header's value (set by a front proxy
  such as oauth2-proxy's ``x-forwarded-user``); a request without it gets a 401.
* ``none``: one tenant, ``none`` — one person's proxy on localhost. Its keys are the session
  ids themselves, so a store written before tenants existed reads as tenant ``none``.

Everything in ``__all__`` gets re-exported.
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
    """The store key of a tenant's session: the session id itself for tenant ``none`` (as
    before tenants existed), else ``<tenant>/<session id>``."""
    return session_id if tenant == NO_TENANT else f"{tenant}/{session_id}"


@dataclass(frozen=True)
class TenantScope:
    """``session.scope`` with its secret, ready to tell a request's tenant."""

    scope: str
    secret: bytes | None = None

    @classmethod
    def from_config(cls, session: SessionConfig,
                    environ: Mapping[str, str] = os.environ) -> TenantScope:
        """The scope of a config; the secret read from ``session.secret_env``.

        Raises:
            ConfigError: scope ``credential`` without a secret in its variable.
        """
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
        """The tenant of a credential: an ``x-api-key`` value, or an ``Authorization`` value
        (its ``Bearer`` scheme dropped, so one key is one tenant however it is sent)."""
        scheme, _, token = credential.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            credential = token
        return "t" + self._digest(credential.strip())

    def header_tenant(self, value: str) -> str:
        """The tenant of a front proxy's header value."""
        return "h" + self._digest(value.strip())

    def tenant_of(self, headers: Mapping[str, str]) -> str:
        """The tenant of a request.

        Raises:
            RequestRejected: 401 ``authentication_error``: the scope needs a credential or a
                header the request does not carry.
        """
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
                # Its access key id is no secret, and the proxy cannot check the signature:
                # anyone could claim another's tenant with it.
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
