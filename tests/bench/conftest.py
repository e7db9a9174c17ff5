"""The smoke tests check a benchmark's structure, not its figures: each runs its benchmark with
a short warm-up (a request to open the connections and one more), not the tens of requests a
real measurement sends every process before counting."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

#: The benchmarks that warm every process up with ``WARMUP`` requests before they count.
_WARMED = ("bench.features", "bench.instructions", "bench.providers", "bench.shared",
           "bench.steps")
#: The smoke tests' warm-up.
SMOKE_WARMUP = 2


@pytest.fixture(autouse=True)
def short_warmup(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``WARMUP`` of every benchmark module loaded is :data:`SMOKE_WARMUP` for the test."""
    for name in _WARMED:
        module = sys.modules.get(name)
        if module is not None:
            monkeypatch.setattr(module, "WARMUP", SMOKE_WARMUP)
    yield
