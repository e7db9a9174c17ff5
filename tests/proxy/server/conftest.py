"""Fixtures of the server tests: the stamped fake provider of the ``--workers`` tests."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from tests.proxy.server.workers_fleet import START_TIMEOUT_S, Logged
from tests.redis_server import free_port


@pytest.fixture(scope="session")
def upstream() -> Iterator[str]:
    """The stamped fake provider (``bench/stamped_upstream.py``: the strict fake provider,
    whose events a request header can slow down) in its own process; its base URL."""
    process = Logged([sys.executable, "-m", "bench.stamped_upstream", "--port", str(free_port())])
    try:
        url = process.wait_for("listening", timeout_s=START_TIMEOUT_S)[0]["url"]
        yield str(url)
    finally:
        process.stop()
