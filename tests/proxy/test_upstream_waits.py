"""The upstream read timeout kept by one sweep (proxy.http.upstream_waits), and what it saves:
no timer armed per read."""

from __future__ import annotations

import asyncio
import time

import pytest

from proxy.http.upstream_waits import MAX_SWEEP_INTERVAL_S, UpstreamWaits

MODEL = "claude-sonnet-4-5"


def test_a_wait_over_the_timeout_is_failed_once_and_an_ended_one_never() -> None:
    waits = UpstreamWaits(10.0)
    failed: list[str] = []
    now = time.monotonic()
    slow = waits.begin(failed.append, "slow")
    ended = waits.begin(failed.append, "ended")
    assert waits.end(ended) is True
    assert waits.end(ended) is False  # (again: harmless)
    assert waits.sweep(now + 9.9) == 0 and failed == []
    assert waits.sweep(now + 10.5) == 1 and failed == ["slow"]
    assert waits.sweep(now + 100) == 0 and failed == ["slow"] and len(waits) == 0
    assert waits.end(slow) is False  # failed by the sweep: its reader learns so


def test_touching_a_wait_counts_it_from_then() -> None:
    waits = UpstreamWaits(0.2)
    failed: list[int] = []
    key = waits.begin(failed.append, 1)
    time.sleep(0.15)
    waits.touch(key)
    assert waits.sweep(time.monotonic() + 0.1) == 0
    assert waits.sweep(time.monotonic() + 0.25) == 1 and failed == [1]
    waits.touch(key)  # (over already: nothing to touch)


def test_a_request_over_the_timeout_fails_with_a_timeout_and_is_cancelled() -> None:
    """:meth:`UpstreamWaits.request`: the sweep cancels what is awaited, and the request
    fails with TimeoutError; an answer in time is returned as it is."""
    async def run() -> None:
        waits = UpstreamWaits(0.1)
        sweeping = asyncio.get_running_loop().create_task(waits.run())
        cancelled = asyncio.Event()

        async def hang(key: int) -> str:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return "late"

        async def answer(key: int) -> str:
            await asyncio.sleep(0.01)
            return "in time"

        try:
            assert await waits.request(answer) == "in time"
            with pytest.raises(TimeoutError, match="no answer within 0.1 s"):
                await waits.request(hang)
            assert cancelled.is_set() and len(waits) == 0
            assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
        finally:
            sweeping.cancel()

    asyncio.run(run())


def test_a_request_cancelled_by_someone_else_stays_cancelled() -> None:
    """The client going away (the handler cancelled) is not turned into a timeout, even when
    the sweep fails the same wait at the same moment."""
    async def run() -> None:
        waits = UpstreamWaits(10.0)
        started = asyncio.Event()

        async def hang(key: int) -> None:
            started.set()
            await asyncio.sleep(30)

        task = asyncio.get_running_loop().create_task(waits.request(hang))
        await started.wait()
        task.cancel()  # the client's going away
        waits.sweep(time.monotonic() + 11)  # and the sweep's, at once
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())


@pytest.mark.parametrize(("timeout", "interval"), [
    (600.0, MAX_SWEEP_INTERVAL_S), (2.0, 0.5), (0.3, 0.075), (0.01, 0.02)])
def test_the_sweep_runs_at_most_a_second_apart(timeout: float, interval: float) -> None:
    """A wait fails between the timeout and the timeout plus the interval: a quarter of the
    timeout, at most a second (at least 20 ms)."""
    assert UpstreamWaits(timeout).interval_s == pytest.approx(interval)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_a_timeout_must_be_positive(bad: float) -> None:
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        UpstreamWaits(bad)


def test_the_sweep_fails_a_wait_in_time_when_it_runs() -> None:
    """:meth:`UpstreamWaits.run` sweeps on its own: a wait over the timeout is failed
    within the timeout plus one interval."""
    async def run() -> float:
        loop = asyncio.get_running_loop()
        waits = UpstreamWaits(0.2)
        failed: asyncio.Future[float] = loop.create_future()
        started = time.monotonic()
        waits.begin(lambda future: future.set_result(time.monotonic()), failed)
        sweeping = loop.create_task(waits.run())
        try:
            return await asyncio.wait_for(failed, 2.0) - started
        finally:
            sweeping.cancel()

    took = asyncio.run(run())
    assert 0.2 <= took < 0.2 + UpstreamWaits(0.2).interval_s + 0.2
