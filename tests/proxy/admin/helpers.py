"""What the admin API tests share: the token, state bodies, the Admin client, error checks."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, MutableMapping
from typing import Any

import aiohttp
import structlog
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from compactor import DurableContextState
from proxy.store import SQLiteStateStore

TOKEN = "tok-7f3a9c1e5b2d4e6f8a0b1c3d5e7f9a2b"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SECRET_FACT = "the deploy key lives in vault path kv/prod/deploy"
STATE_PATH = "/admin/sessions/sess-1/state"


def state_body(content: str = SECRET_FACT, *, fact_id: str = "f1") -> dict[str, Any]:
    """A valid PUT body with one item of each kind."""
    return {
        "facts": [{"fact_id": fact_id, "content": content,
                   "source_pointer": "transcript:sess-1:3",
                   "last_confirmed_at": "2025-03-01T12:30:00+00:00"}],
        "pending_items": [{"item_id": "p1", "description": "rotate the key",
                           "source_pointer": "transcript:sess-1:4",
                           "last_confirmed_at": "2025-03-01T12:31:00Z"}],
        "retrieval_evidence": [{"memory_id": "m1", "source_id": "transcript:sess-1:5",
                                "source_type": "transcript", "source_title": "turn 5",
                                "captured_at": "2025-03-01T12:32:00+00:00", "score": 0.5,
                                "source_rank": 1, "conflict_key": None}],
    }


def _state() -> DurableContextState:
    """The state that ``state_body()`` describes."""
    return DurableContextState.from_dict(state_body())


async def forwarder(request: web.Request) -> web.Response:
    """Stands in for the proxy's catch-all forwarder, registered after setup_admin."""
    return web.json_response({"forwarded": request.path}, status=299)


class Admin:
    """A running app with the admin API (or its absence) and a client talking to it."""

    def __init__(self, server: TestServer, client: aiohttp.ClientSession,
                 store: SQLiteStateStore) -> None:
        self.server = server
        self.client = client
        self.store = store

    def url(self, path: str) -> URL:
        """The absolute URL of ``path`` on the server, taken as already encoded."""
        return URL(str(self.server.make_url("/")).rstrip("/") + path, encoded=True)

    async def call(self, method: str, path: str, *, headers: dict[str, str] | None = None,
                   body: Any = None, data: Any = None) -> tuple[int, Any, Any]:
        """Make one request; return (status, decoded JSON body or None, headers)."""
        kwargs: dict[str, Any] = {"headers": headers or {}}
        if body is not None:
            kwargs["json"] = body
        if data is not None:
            kwargs["data"] = data
        async with self.client.request(method, self.url(path), **kwargs) as resp:
            raw = await resp.read()
            return resp.status, json.loads(raw) if raw else None, resp.headers


def with_auth(**extra: str) -> dict[str, str]:
    """The admin Authorization header plus ``extra`` headers (underscores become dashes)."""
    headers = dict(AUTH)
    headers.update({key.replace("_", "-"): value for key, value in extra.items()})
    return headers


def assert_error(body: Any, error_type: str) -> str:
    """Check the Anthropic error shape and type; return the message."""
    assert body["type"] == "error"
    assert body["error"]["type"] == error_type
    message = body["error"]["message"]
    assert isinstance(message, str) and message
    return message


# --- logs -------------------------------------------------------------------------------


@contextlib.contextmanager
def captured_logs() -> Iterator[list[MutableMapping[str, Any]]]:
    """``structlog.testing.capture_logs`` at every level: a configuration another test left
    in this process (a warning-level filter) must not hide the lines looked for."""
    before = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
                        cache_logger_on_first_use=False)
    try:
        with structlog.testing.capture_logs() as logs:
            yield logs
    finally:
        structlog.configure(wrapper_class=before["wrapper_class"],
                            cache_logger_on_first_use=before["cache_logger_on_first_use"])
