"""Fixtures of the proxy tests: a real ``redis-server`` for the Redis store, and a real
three-master Redis Cluster (each one per test session, started only when a test asks for
it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.redis_server import RedisClusterServers, RedisServer, RedisServerUnavailable
from tests.servers import started


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A running ``redis-server`` on a free loopback port; fails (never skips) when missing."""
    with started(RedisServer(), RedisServerUnavailable) as server:
        yield server


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer) -> str:
    """The URL (``redis://127.0.0.1:<port>/0``) of the session's ``redis-server``."""
    return redis_server.url


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterServers]:
    """A three-master Redis Cluster on free loopback ports; fails (never skips) when
    ``redis-server`` or ``redis-cli`` is missing."""
    with started(RedisClusterServers(), RedisServerUnavailable) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def redis_cluster_url(redis_cluster: RedisClusterServers) -> str:
    """The URL of one node of the session's Redis Cluster."""
    return redis_cluster.url
