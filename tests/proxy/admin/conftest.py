"""Fixtures of the admin API tests: a SQLite store and the admin app on a real loopback server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.admin.api import setup_admin
from proxy.store import SQLiteStateStore
from tests.proxy.admin.helpers import TOKEN, Admin, forwarder


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStateStore]:
    """A real SQLite store on a fresh file."""
    opened = await SQLiteStateStore(tmp_path / "admin" / "state.db").open()
    yield opened
    await opened.close()


@pytest.fixture
async def start(store: SQLiteStateStore) -> AsyncIterator[Any]:
    """Start an app with ``setup_admin(app, store, token)`` then a catch-all forwarder."""
    started: list[tuple[TestServer, aiohttp.ClientSession]] = []

    async def _start(token: str | None) -> Admin:
        app = web.Application()
        setup_admin(app, store, token)
        app.router.add_route("*", "/{tail:.*}", forwarder)
        server = TestServer(app, host="127.0.0.1", port=0)
        await server.start_server()
        client = aiohttp.ClientSession()
        started.append((server, client))
        return Admin(server, client, store)

    yield _start
    for server, client in started:
        await client.close()
        await server.close()


@pytest.fixture
async def admin(start: Any) -> Admin:
    """The admin API enabled with TOKEN."""
    result: Admin = await start(TOKEN)
    return result
