"""Fixtures of the proxy tests: a real ``redis-server`` for the Redis store (one per test
session, started only when a test asks for it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.redis_server import RedisServer, RedisServerUnavailable


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A running ``redis-server`` on a free loopback port; fails (never skips) when missing."""
    server = RedisServer()
    problem = ""
    try:
        server.start()
    except RedisServerUnavailable as exc:
        problem = str(exc)
    if problem:
        # Outside the except block, so the report is the one line, not a chained traceback.
        pytest.fail(problem, pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer) -> str:
    """The URL (``redis://127.0.0.1:<port>/0``) of the session's ``redis-server``."""
    return redis_server.url
