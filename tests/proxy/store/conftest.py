"""Fixtures of the store tests: store_factory (one per backend) and the opened store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from proxy.store import StoreBackend
from tests.proxy.store.helpers import BACKENDS, StoreFactory, unique_prefix


@pytest.fixture(params=BACKENDS)
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    """This test's store location on each backend; Redis is started only when asked for."""
    if request.param == "sqlite":
        return StoreFactory("sqlite", str(tmp_path / "state.db"))
    if request.param == "redis-cluster":
        cluster_url: str = request.getfixturevalue("redis_cluster_url")
        return StoreFactory("redis-cluster", cluster_url, unique_prefix())
    redis_url: str = request.getfixturevalue("redis_url")
    return StoreFactory("redis", redis_url, unique_prefix())


@pytest.fixture
async def store(store_factory: StoreFactory) -> AsyncIterator[StoreBackend]:
    """An opened store on this test's fresh data, closed after the test."""
    opened = await store_factory.open()
    yield opened
    await opened.close()
