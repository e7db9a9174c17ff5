"""Fixtures for the fake upstream: a real server on 127.0.0.1 (port 0) and real clients."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import pytest

from proxy.fake_upstream import FakeUpstream, start_fake_upstream


def corpus_bodies(folder: Path) -> list[Any]:
    """The corpus request bodies of one folder as pytest params, named by file."""
    return [
        pytest.param(path, id=path.name[:70])
        for path in sorted(folder.glob("*.json"))
        if path.name != "manifest.json"
    ]


def load_body(path: Path) -> dict[str, Any]:
    """One corpus file as a request body."""
    body: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return body


@pytest.fixture
def upstream() -> FakeUpstream:
    """A fresh fake upstream with the default script."""
    return FakeUpstream()


@pytest.fixture
async def base_url(upstream: FakeUpstream) -> AsyncIterator[str]:
    """The fake upstream served on a free loopback port."""
    runner, url = await start_fake_upstream(upstream)
    try:
        yield url
    finally:
        await runner.cleanup()


@pytest.fixture
async def client(base_url: str) -> AsyncIterator[anthropic.AsyncAnthropic]:
    """The real anthropic SDK pointed at the fake upstream, retries off."""
    sdk = anthropic.AsyncAnthropic(base_url=base_url, api_key="test-key", max_retries=0)
    try:
        yield sdk
    finally:
        await sdk.close()


@pytest.fixture
async def http(base_url: str) -> AsyncIterator[aiohttp.ClientSession]:
    """A raw aiohttp session on the fake upstream, for requests the SDK would never send."""
    async with aiohttp.ClientSession(base_url=base_url) as session:
        yield session
