"""bench/steps.py at a tiny size: a structure check, not a timed test."""

from __future__ import annotations

import asyncio

import pytest

from bench import steps


@pytest.mark.slow
def test_both_processes_are_counted_and_the_table_prints() -> None:
    """The relay and the proxy each executed steps while traced: the relay none of the
    proxy's packages, the proxy its request path (the handler, the compactor, the log line);
    the table names both and the proxy's busiest functions."""
    results = asyncio.run(steps.measure(20_000, 3))
    relay, proxy = results["relay"], results["proxy"]
    assert relay.requests == proxy.requests == 3
    assert relay.total > 1_000 and proxy.total > relay.total
    assert "proxy" not in relay.packages and "compactor" not in relay.packages
    assert proxy.packages["proxy"] > 0 and proxy.packages["compactor"] > 0
    assert any(name.endswith("handlers.py:_compact_and_forward") for name in proxy.functions)
    assert sum(proxy.packages.values()) == pytest.approx(proxy.total)
    # both on uvloop (the default): neither ran asyncio's own loop in Python steps
    for counted in (relay, proxy):
        assert not any(name.endswith("base_events.py:_run_once") for name in counted.functions)
    table = steps.format_steps(results, 20_000, False, top=5)
    assert "bare relay" in table and "x the relay" in table
    assert table.count("\n") >= 5 + 4


def test_a_file_is_named_by_its_package() -> None:
    root = steps._ROOT
    assert steps._package(f"{root}/proxy/http/handlers.py") == "proxy"
    assert steps._package("/x/lib/python3.11/site-packages/aiohttp/web.py") == "aiohttp"
    assert steps._package("/x/lib/python3.11/asyncio/events.py") == "asyncio"
    assert steps._package("/x/lib/python3.11/selectors.py") == "selectors"
    assert (steps._function("/x/lib/python3.11/asyncio/events.py", "_run")
            == "asyncio/events.py:_run")
