"""bench/instructions.py at a tiny size: a structure check, not a timed test (needs valgrind;
skipped without it)."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from bench import instructions

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("valgrind") is None,
                                 reason="valgrind is not installed (apt-get install valgrind)")]


def test_every_process_is_counted_and_the_table_prints() -> None:
    """The relay, the proxy and a baseline (the checked-out commit) each ran user-space
    instructions for every counted request; the table has a row per process."""
    found = asyncio.run(instructions.measure(20_000, requests=2, baseline="HEAD"))
    assert list(found.per_request) == ["relay", "relay on uvloop", "proxy", "baseline HEAD"]
    assert all(count > 10_000 for count in found.per_request.values())
    assert found.ratio("relay") == 1.0
    assert found.ratio("proxy") == found.per_request["proxy"] / found.per_request["relay"]
    table = instructions.format_instructions(found, audit=False)
    assert table.count("\n") == 5 and "audit log off" in table and "baseline HEAD" in table
