"""Work that runs after a response: bookkeeping a request never waits for.

The usage ledger's additions and the audit log's records are written here. Each task is held
in the app's ``BACKGROUND`` set until it ends (so it is not garbage-collected half-way), and
the app waits for what is still running at shutdown (:mod:`proxy.app`). A failure is one
warning line naming the error's class; it never reaches the client, whose answer is already
on its way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import structlog
from aiohttp import web

from proxy.keys import BACKGROUND, STORE_HEALTH
from proxy.state.store import StoreUnavailable

__all__ = ["in_background"]

_log = structlog.get_logger("proxy.background")


def in_background(app: web.Application, work: Coroutine[Any, Any, None], *,
                  failure_event: str) -> None:
    """Run ``work`` after the response, never failing the request; held until it ends.

    Args:
        app: the application whose ``BACKGROUND`` set holds the task.
        work: the coroutine to run.
        failure_event: the warning logged when it fails (``usage_not_recorded``, ...).
    """

    async def run() -> None:
        try:
            await work
        except StoreUnavailable as exc:
            # Fails fast while the store is down: counted in the once-a-second line, not
            # one warning per request.
            app[STORE_HEALTH].note_unavailable(failure_event, exc)
        except Exception as exc:  # noqa: BLE001 - bookkeeping never fails a request
            _log.warning(failure_event, error_class=type(exc).__name__)

    task = asyncio.get_running_loop().create_task(run())
    tasks = app[BACKGROUND]
    tasks.add(task)
    task.add_done_callback(tasks.discard)
