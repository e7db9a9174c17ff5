"""The event loop a serving process runs on (``listen.event_loop``).

``uvloop`` (the default) is libuv's loop, written in C: each iteration, its timers and its
callbacks cost no Python bytecode, where asyncio's own loop runs them all in Python. A
request crosses the loop dozens of times (the client's socket, the provider's, the answer's
chunks), so uvloop saves CPU on every request (bench/README.md, "Figures the README used to
quote"; ``bench/proxy.py`` times the relay on both loops). ``asyncio`` is the standard library's
loop, for a platform uvloop does not support or to rule it out when debugging.

Everything above the loop is the same on both: the proxy uses asyncio's interfaces only, and
the test suite passes on either.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from proxy.config import ConfigError, EventLoopName

__all__ = ["loop_factory", "run"]

T = TypeVar("T")


def loop_factory(name: EventLoopName) -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes a new event loop of kind ``name``.

    Raises:
        ConfigError: ``uvloop`` is asked for and cannot be imported (``listen.event_loop``).
    """
    if name == "asyncio":
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError as exc:
        raise ConfigError("listen.event_loop",
                          f"uvloop cannot be loaded here ({exc}); set it to asyncio") from None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(main: Coroutine[Any, Any, T], name: EventLoopName) -> T:
    """``asyncio.run(main)`` on a new event loop of kind ``name``.

    Raises:
        ConfigError: see :func:`loop_factory` (``main`` is closed, never run).
    """
    try:
        factory = loop_factory(name)
    except ConfigError:
        main.close()
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
