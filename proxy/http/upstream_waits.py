"""The upstream read timeout (``upstream.read_timeout_s``), kept by one sweep for all requests.

A wait for the provider — for its answer's headers, or for the next bytes of its body — that
lasts longer than the timeout fails: the request with the 504 of a provider that does not
answer, a body relayed part-way with the error of a stalled stream. aiohttp's own
``sock_read`` does this with a timer per read, armed and cancelled on the event loop: two per
request, on asyncio's heap of timers ordered by Python comparisons (about 9 µs a request
here; ``asyncio.timeout`` contexts would cost as much: 6.7 µs each). Here a wait is an entry in
a dict, begun and ended with a time stamp (about 3 µs a request), and one sweep a second (a
quarter of the timeout, when that is shorter) fails those that are over: a wait fails between
the timeout and the timeout plus the sweep's interval.

Only the time spent waiting for the provider counts. A relay held back by a slow client, or
a request body still being uploaded (:meth:`UpstreamWaits.touch`, per chunk sent), is not a
silent provider.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import aiohttp

__all__ = ["MAX_SWEEP_INTERVAL_S", "UpstreamWaits", "read_some"]

#: The longest time between two sweeps (seconds).
MAX_SWEEP_INTERVAL_S: Final = 1.0
#: The shortest, whatever the timeout (seconds).
MIN_SWEEP_INTERVAL_S: Final = 0.02

T = TypeVar("T")


class UpstreamWaits:
    """The waits for the provider now under way, and the sweep that fails those that last
    longer than ``timeout_s``. Used from one event loop; times are ``time.monotonic()``.

    Args:
        timeout_s: how long a wait may last (``upstream.read_timeout_s``).
    """

    def __init__(self, timeout_s: float) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.timeout_s = timeout_s
        #: The time between two sweeps.
        self.interval_s = min(MAX_SWEEP_INTERVAL_S, max(MIN_SWEEP_INTERVAL_S, timeout_s / 4))
        # key -> [when it began, what fails it, what that is given]
        self._waits: dict[int, list[Any]] = {}
        self._keys = itertools.count()

    def __len__(self) -> int:
        return len(self._waits)

    def begin(self, fail: Callable[[T], object], subject: T) -> int:
        """Start a wait; ``fail(subject)`` is called if it lasts longer than the timeout (once,
        and the wait is over then). Returns its key for :meth:`end` and :meth:`touch`."""
        key = next(self._keys)
        self._waits[key] = [time.monotonic(), fail, subject]
        return key

    def touch(self, key: int) -> None:
        """Count the wait from now (something moved: a chunk of the request body went out)."""
        wait = self._waits.get(key)
        if wait is not None:
            wait[0] = time.monotonic()

    def end(self, key: int) -> bool:
        """The wait is over, however it ended; ``False`` when the sweep failed it (or it
        ended before)."""
        return self._waits.pop(key, None) is not None

    def sweep(self, now: float) -> int:
        """Fail every wait begun (or touched) ``timeout_s`` or more before ``now``; returns how
        many."""
        cutoff = now - self.timeout_s
        over = [key for key, (began, _, _) in self._waits.items() if began <= cutoff]
        for key in over:
            _, fail, subject = self._waits.pop(key)
            fail(subject)
        return len(over)

    async def run(self) -> None:
        """Sweep every :attr:`interval_s` until cancelled."""
        while True:
            await asyncio.sleep(self.interval_s)
            self.sweep(time.monotonic())

    async def request(self, send: Callable[[int], Awaitable[T]]) -> T:
        """``await send(key)`` (the request, up to the answer's headers) within the timeout;
        ``key`` is the wait's, for :meth:`touch` (a body still being uploaded).

        Raises:
            TimeoutError: no answer within the timeout (the request was cancelled).
        """
        task = asyncio.current_task()
        assert task is not None
        cancelling = task.cancelling()
        key = self.begin(asyncio.Task.cancel, task)
        try:
            answer = await send(key)
        except asyncio.CancelledError:
            # The sweep's cancellation, and nobody else's (the client's going away wins),
            # becomes the timeout: asyncio.timeout's rule, without its timer.
            if not self.end(key) and task.uncancel() <= cancelling:
                raise TimeoutError(f"no answer within {self.timeout_s} s") from None
            raise
        except BaseException:
            if not self.end(key):
                task.uncancel()  # (the sweep's cancellation, taken by what failed otherwise)
            raise
        if not self.end(key):
            task.uncancel()  # (the sweep's cancellation came as the answer did, and was taken)
        return answer


def _stalled(content: aiohttp.StreamReader) -> None:
    # What aiohttp's sock_read sets on a body that stopped coming.
    content.set_exception(aiohttp.SocketTimeoutError("Timeout on reading data from socket"))


async def read_some(waits: UpstreamWaits, upstream: aiohttp.ClientResponse) -> bytes:
    """The next bytes of the provider's answer (``b""`` at its end), within the timeout.

    Raises:
        aiohttp.SocketTimeoutError: none came within the timeout.
        aiohttp.ClientError: the answer failed otherwise.
    """
    content = upstream.content
    key = waits.begin(_stalled, content)
    try:
        return await content.readany()
    finally:
        waits.end(key)
