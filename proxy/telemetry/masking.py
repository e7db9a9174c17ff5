"""Secrets masked where the configuration is shown (``check-config``, config errors), and the
secrets the log redactor blanks.

Secrets are named by environment variable, but a URL may carry one itself (a Redis password,
a key in a query string): :func:`mask_url` masks those and keeps the rest as written, so the
operator can still check what the proxy will reach.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import unquote

if TYPE_CHECKING:
    from proxy.config import Config

__all__ = ["MASK", "config_secrets", "mask_config", "mask_url", "url_password"]

#: What a secret is shown as.
MASK: Final = "***"

#: A query parameter whose value is a secret: a password, token, key, signature, credential.
_SECRET_PARAMETER: Final = re.compile(
    r"pass|pwd|secret|token|key|auth|sig|credential|session", re.IGNORECASE)
#: A configuration key that holds a secret itself (``..._env`` holds a variable's name).
_SECRET_KEY: Final = re.compile(
    r"(?:^|_)(?:password|passwd|secret|token|api_key|key|credentials?)$", re.IGNORECASE)
_SCHEME: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def _split(url: str) -> tuple[str, str, str, str] | None:
    """``(scheme://, user information, the rest of the authority and path, query and
    fragment)``, or ``None`` for a text with neither a ``scheme://`` nor an ``@``. The user
    information ends at the last ``@`` before the query (a password may hold a raw ``/``),
    with or without a scheme (a mistyped one: ``rediss//:secret@host``)."""
    match = _SCHEME.match(url)
    scheme = "" if match is None else match.group()
    rest = url[len(scheme):]
    if not scheme and "@" not in rest:
        return None
    cut = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    head, tail = rest[:cut], rest[cut:]
    userinfo, at, host = head.rpartition("@")
    return scheme, userinfo if at else "", host if at else head, tail


def url_password(url: str) -> str | None:
    """The password in ``url``'s user information (``None`` when it has none)."""
    parts = _split(url)
    if parts is None or ":" not in parts[1]:
        return None
    return parts[1].partition(":")[2] or None


def mask_url(url: str) -> str:
    """``url`` with its password and its key-like query values masked; any other text (a
    path, a name) as it is."""
    parts = _split(url)
    if parts is None:
        return url
    scheme, userinfo, host, tail = parts
    if ":" in userinfo:
        userinfo = f"{userinfo.partition(':')[0]}:{MASK}"
    query, hash_mark, fragment = tail.partition("#")
    if query.startswith("?"):
        query = "?" + "&".join(_mask_parameter(pair) for pair in query[1:].split("&"))
    return f"{scheme}{userinfo}{'@' if userinfo else ''}{host}{query}{hash_mark}{fragment}"


def _mask_parameter(pair: str) -> str:
    name, equals, _value = pair.partition("=")
    return f"{name}={MASK}" if equals and _SECRET_PARAMETER.search(name) else pair


def mask_config(data: Any) -> Any:
    """``data`` (mappings, lists, scalars) with every URL masked (:func:`mask_url`) and every
    string under a secret-like key replaced by :data:`MASK`."""
    if isinstance(data, dict):
        return {key: MASK if (isinstance(value, str) and isinstance(key, str)
                              and _SECRET_KEY.search(key)) else mask_config(value)
                for key, value in data.items()}
    if isinstance(data, list):
        return [mask_config(item) for item in data]
    if isinstance(data, str):
        return mask_url(data)
    return data


def config_secrets(config: Config) -> list[str]:
    """Every secret the log lines must never show: the admin token, the summary key, and each
    configured URL's password (as written, and decoded)."""
    secrets = [config.admin_token(), config.summary_api_key()]
    for url in (config.store.url, config.upstream.base_url, config.sources.s3.endpoint_url):
        password = url_password(url) if url else None
        if password:
            secrets += [password, unquote(password)]
    return sorted({secret for secret in secrets if secret})
