"""Smoke test of ``bench/scale.py``: a tiny run against the real processes (the stamped fake
provider, ``serve --workers 1`` and ``serve --workers 2``) reports well-formed figures.

Nothing here asserts a timing: the rates must be present, finite and consistent with each
other, every answer a 200, and the two-worker proxy must really have run two workers.
"""

from __future__ import annotations

import asyncio
import math

import pytest

import bench.scale as scale

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def results() -> scale.ScaleResults:
    """One run at the tiny size."""
    return asyncio.run(scale.run_scale(scale.TINY))


def test_every_target_has_a_rate_per_round_and_no_failure(results: scale.ScaleResults) -> None:
    """Three targets, each a positive rate over all rounds and one per round."""
    assert set(results.rps) == set(scale.TARGETS) == {"workers_1", "workers_2", "direct"}
    for name in scale.TARGETS:
        assert math.isfinite(results.rps[name]) and results.rps[name] > 0
        assert len(results.round_rps[name]) == scale.TINY.rounds
        assert all(rate > 0 for rate in results.round_rps[name])
        assert results.failures[name] == 0
    # The overall rate is the harmonic mean of the rounds' (equal requests per round).
    for name in scale.TARGETS:
        rounds = results.round_rps[name]
        assert results.rps[name] == pytest.approx(len(rounds) / sum(1 / r for r in rounds))


def test_the_ratio_is_workers_2_over_workers_1(results: scale.ScaleResults) -> None:
    """The headline figure is computed from the same run's two rates."""
    assert results.ratio == pytest.approx(results.rps["workers_2"] / results.rps["workers_1"])
    assert results.as_json()["ratio"] == results.ratio


def test_the_two_worker_proxy_ran_two_worker_processes(results: scale.ScaleResults) -> None:
    """The supervisor of ``--workers 2`` had two children; both proxies used CPU."""
    assert results.processes == {"workers_1": 1, "workers_2": 2}
    assert set(results.cpu_ms) == {"workers_1", "workers_2"}
    assert all(math.isfinite(ms) and ms > 0 for ms in results.cpu_ms.values())
    assert set(results.shared_cpu_ms) == set(scale.TARGETS)
    for used in results.shared_cpu_ms.values():
        assert set(used) == {"client", "provider"}
        assert all(math.isfinite(ms) and ms >= 0 for ms in used.values())
    assert results.cores >= 1
    assert results.layers == ""  # the tiny request is under the soft threshold
    assert set(results.machine_busy) == set(scale.TARGETS)
    # A share of a tiny run may round to 0, or be unmeasured (NaN) when no 10 ms tick of
    # /proc/stat passed: structure and bounds only.
    assert all(math.isnan(share) or 0.0 <= share <= 1.0
               for share in results.machine_busy.values())


def test_the_report_prints_every_target_and_the_ratio(results: scale.ScaleResults) -> None:
    """One line per target and the ratio line."""
    report = scale.format_report(results)
    for label in ("serve --workers 1", "serve --workers 2", "provider directly"):
        assert label in report
    assert f"--workers 2 / --workers 1: {results.ratio:.2f}x" in report
