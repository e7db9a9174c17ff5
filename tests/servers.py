"""Starting a throw-away server for tests: the one way every fixture does it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol, TypeVar

import pytest

__all__ = ["started"]


class _Server(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...


S = TypeVar("S", bound=_Server)


@contextmanager
def started(server: S, unavailable: type[Exception]) -> Iterator[S]:
    """``server`` started, then stopped; when it cannot start (``unavailable``: not
    installed, did not come up) the test fails — never skips — with the one-line reason."""
    problem = ""
    try:
        server.start()
    except unavailable as exc:
        problem = str(exc)
    if problem:
        # Outside the except block, so the report is the one line, not a chained traceback.
        pytest.fail(problem, pytrace=False)
    try:
        yield server
    finally:
        server.stop()
