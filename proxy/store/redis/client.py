"""The redis-py client of each deployment (``store.redis_mode``): one server, a Cluster, or
the primary the Sentinels name; and what its failures mean (an outage or not)."""

from __future__ import annotations

from typing import Any, Final, Literal, cast, get_args
from urllib.parse import unquote, urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import (
    ClusterDownError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["FAILURES", "OUTAGES", "REDIS_MODES", "SENTINEL_PORT", "Failure", "RedisMode",
           "make_client", "redacted_url", "sentinels"]

#: How a store reaches Redis (``store.redis_mode``).
RedisMode = Literal["standalone", "cluster", "sentinel"]
REDIS_MODES: Final[tuple[str, ...]] = get_args(RedisMode)
#: The Sentinels' port when ``store.url`` names none.
SENTINEL_PORT: Final = 26379

# Everything redis-py raises: its cluster client's own errors are not RedisErrors.
FAILURES: Final = (RedisError, RedisClusterException)
Failure = RedisError | RedisClusterException
# The server cannot be reached, or cannot answer for now (a failover, a load, a primary
# turned replica, a cluster resharding or down): retrying later may succeed.
OUTAGES: Final = (RedisConnectionError, RedisTimeoutError, ClusterDownError, TryAgainError,
                   ReadOnlyError)


def redacted_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``, for error messages and logs."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "<unparseable redis url>"
    if password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def sentinels(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """The Sentinels' addresses of a ``sentinel`` mode URL, and the primary's connection
    options (database, credentials, TLS) from it; :class:`ValueError` for a bad URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        raise ValueError("sentinel mode needs a redis:// or rediss:// URL")
    if parts.query:
        raise ValueError("sentinel mode takes no options in the URL")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    addresses = []
    for address in hosts.split(","):
        if address.startswith("["):  # [IPv6]:port
            host, _, rest = address[1:].partition("]")
            port = rest.removeprefix(":")
        else:
            host, _, port = address.partition(":")
        if not host or (port and not port.isdigit()):
            raise ValueError(f"sentinel address {address!r} is not host[:port]")
        addresses.append((host, int(port) if port else SENTINEL_PORT))
    options: dict[str, Any] = {"ssl": parts.scheme == "rediss"}
    path = parts.path.strip("/")
    if path:
        if not path.isdigit():
            raise ValueError(f"database {path!r} is not a number")
        options["db"] = int(path)
    if userinfo:
        user, _, password = userinfo.partition(":")
        options["username"] = unquote(user) or None
        options["password"] = unquote(password) or None
    return addresses, options


def make_client(url: str, mode: str, service: str | None,
            timeout_s: float) -> aioredis.Redis | RedisCluster:
    """The redis-py client of ``mode``, nothing connected yet; a command is retried once on a
    connection error, never on a timeout (a script may have run)."""
    options: dict[str, Any] = {
        "socket_connect_timeout": timeout_s, "socket_timeout": timeout_s,
        "retry": Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
    }
    if mode == "cluster":
        if urlsplit(url).scheme not in ("redis", "rediss"):
            raise ValueError("cluster mode needs a redis:// or rediss:// URL")
        return RedisCluster.from_url(url, **options)
    if mode == "sentinel":
        if not service:
            raise ValueError("sentinel mode needs the service name of the primary")
        addresses, primary = sentinels(url)
        sentinel_options = {"socket_connect_timeout": timeout_s, "socket_timeout": timeout_s}
        sentinel = Sentinel(addresses, sentinel_kwargs=sentinel_options,  # type: ignore[no-untyped-call,unused-ignore]
                            **options)
        return cast("aioredis.Redis", sentinel.master_for(service, redis_class=aioredis.Redis,
                                                          **primary))
    if mode != "standalone":
        raise ValueError(f"mode must be one of {', '.join(REDIS_MODES)}, got {mode!r}")
    return aioredis.Redis.from_url(url, **options)
