"""The event loop a serving process runs on (``listen.event_loop``): ``uvloop`` (libuv's, in
C: it saves CPU on every request, docs/performance.md) or ``asyncio``'s own. The proxy uses
asyncio's interfaces only, so everything above the loop is the same on both.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from proxy.config import ConfigError, EventLoopName

__all__ = ["loop_factory", "run"]

T = TypeVar("T")


def loop_factory(name: EventLoopName) -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes a new event loop of kind ``name`` (``ConfigError``: no uvloop here)."""
    if name == "asyncio":
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError as exc:
        raise ConfigError("listen.event_loop",
                          f"uvloop cannot be loaded here ({exc}); set it to asyncio") from None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], name: EventLoopName) -> T:
    """``asyncio.run(main)`` on a new event loop of kind ``name`` (``ConfigError``: see
    :func:`loop_factory`; ``main`` is closed, never run)."""
    try:
        factory = loop_factory(name)
    except ConfigError:
        main.close()
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
