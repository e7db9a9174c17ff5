"""bench/probes.py at a small size against the strict fake: a structure check."""

from __future__ import annotations

import asyncio

from bench import probes


def test_direct_recalls_every_fact_and_the_proxy_keeps_what_the_user_typed() -> None:
    """Straight to the fake every fact is in the view; through the proxy (compacted) at least
    the user's instruction and the edited file's path survive, the facts only a model could
    re-tell are gone (the fake's summaries carry no facts)."""
    direct, before, proxied = asyncio.run(probes.measure(turns=24, soft=4_000))
    assert all(direct.right.values())
    assert not before.right["user instruction"]
    assert proxied.right["user instruction"] and proxied.right["file path"]
    assert not proxied.right["identifier"]
    table = probes.format_runs([direct, before, proxied])
    assert table.count("\n") == 3 and "5/5" in table


def test_the_base_url_path_runs_against_a_provider_started_apart() -> None:
    """--base-url: the provider is someone else's (here the fake on its own port), asked
    with and without the proxy the same way."""
    from proxy.fake_upstream import FakeUpstream, start_fake_upstream

    async def run() -> list[probes.Run]:
        runner, url = await start_fake_upstream(FakeUpstream())
        try:
            return await probes.measure(turns=24, soft=4_000, base_url=url, api_key="k")
        finally:
            await runner.cleanup()

    direct, _, proxied = asyncio.run(run())
    assert all(direct.right.values()) and proxied.right["user instruction"]
