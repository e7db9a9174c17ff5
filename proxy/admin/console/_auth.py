"""The console's login session and CSRF tokens: signed values, never the admin token itself.

One key, the HMAC of a fixed label under the admin token, signs everything: every process
sharing the token accepts the same cookies, and changing it ends every console session. The
session cookie is ``<expires>.<nonce>.<signature>``; a form's CSRF token is the HMAC of the
session's nonce (worthless with any other cookie); the login form gets its own nonce cookie
and a CSRF token bound to it, so a cross-site page cannot log the browser in either. A logout
revokes the nonce until the cookie would have expired anyway.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

__all__ = ["LoginSession", "Signer"]

#: How long a login lasts (seconds).
SESSION_TTL_S: Final = 8 * 3600
#: How long a login form stays usable (seconds).
LOGIN_FORM_TTL_S: Final = 3600

_KEY_LABEL: Final = b"compact-proxy console v1"
_NONCE_BYTES: Final = 16


@dataclass(frozen=True, slots=True)
class LoginSession:
    """A valid console login: its nonce (what CSRF tokens are bound to) and expiry."""

    nonce: str
    expires: int


class Signer:
    """Issues and checks the console's cookies and CSRF tokens, keyed by ``admin_token``."""

    def __init__(self, admin_token: str, *, clock: Callable[[], float] = time.time) -> None:
        self._key = hmac.new(admin_token.encode("utf-8"), _KEY_LABEL, hashlib.sha256).digest()
        self._token = admin_token.encode("utf-8")
        self._clock = clock
        # nonce -> expiry of logins ended by a logout in this process.
        self._revoked: dict[str, int] = {}

    def _mac(self, purpose: str, *parts: str) -> str:
        message = ".".join((purpose, *parts)).encode("ascii")
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def _now(self) -> int:
        return int(self._clock())

    def token_matches(self, given: str) -> bool:
        """Whether ``given`` is the admin token (constant-time)."""
        return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), self._token)

    # --- the session cookie -------------------------------------------------------------

    def new_session(self) -> str:
        """A fresh session cookie value."""
        expires = str(self._now() + SESSION_TTL_S)
        nonce = secrets.token_urlsafe(_NONCE_BYTES)
        return f"{expires}.{nonce}.{self._mac('session', expires, nonce)}"

    def session(self, cookie: str | None) -> LoginSession | None:
        """The login a cookie value proves, or ``None`` (absent, forged, expired, revoked)."""
        if not cookie or not cookie.isascii():
            return None
        parts = cookie.split(".")
        if len(parts) != 3 or not parts[0].isdigit():
            return None
        expires, nonce, signature = parts
        if not hmac.compare_digest(signature, self._mac("session", expires, nonce)):
            return None
        if int(expires) <= self._now() or nonce in self._revoked:
            return None
        return LoginSession(nonce, int(expires))

    def revoke(self, login: LoginSession) -> None:
        """End ``login`` in this process (its cookie is refused from now on)."""
        now = self._now()
        for nonce in [n for n, expiry in self._revoked.items() if expiry <= now]:
            del self._revoked[nonce]
        self._revoked[login.nonce] = login.expires

    def csrf(self, login: LoginSession) -> str:
        """The CSRF token every form of ``login`` carries."""
        return self._mac("csrf", login.nonce)

    def csrf_matches(self, login: LoginSession, given: str | None) -> bool:
        """Whether ``given`` is ``login``'s CSRF token (constant-time)."""
        return given is not None and given.isascii() and hmac.compare_digest(
            given, self.csrf(login))

    # --- the login form -----------------------------------------------------------------

    def new_login_form(self, current: str | None = None) -> tuple[str, str]:
        """A login form's nonce cookie value and the CSRF token bound to it: ``current``
        (the browser's nonce cookie) while it has half its life left, so a second login tab
        does not void the first one's form; a fresh one otherwise."""
        if current and current.isascii():
            expires_text = current.partition(".")[0]
            if (expires_text.isdigit()
                    and int(expires_text) - self._now() > LOGIN_FORM_TTL_S // 2):
                return current, self._mac("login", current)
        expires = str(self._now() + LOGIN_FORM_TTL_S)
        nonce = secrets.token_urlsafe(_NONCE_BYTES)
        cookie = f"{expires}.{nonce}"
        return cookie, self._mac("login", cookie)

    def login_form_matches(self, cookie: str | None, given: str | None) -> bool:
        """Whether a login POST carries the CSRF token of its (unexpired) nonce cookie."""
        if not cookie or given is None or not cookie.isascii() or not given.isascii():
            return False
        expires = cookie.partition(".")[0]
        if not expires.isdigit() or int(expires) <= self._now():
            return False
        return hmac.compare_digest(given, self._mac("login", cookie))
