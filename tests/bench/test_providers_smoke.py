"""bench/providers.py at a tiny size: a structure check, not a timed test."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from bench import providers
from bench.proxy import history_of_size, request_body


def test_each_provider_gets_the_conversation_in_its_format() -> None:
    body = request_body(history_of_size(5_000), stream=True)
    path, sent, headers = providers.provider_request("bedrock", body, True)
    assert path.endswith(":0/invoke-with-response-stream") and not headers
    doc = json.loads(sent)
    assert "model" not in doc and "stream" not in doc
    assert doc["messages"] == json.loads(body)["messages"]
    path, sent, _ = providers.provider_request("vertex", body, True)
    assert path.endswith(":streamRawPredict") and json.loads(sent)["stream"] is True


@pytest.mark.slow
def test_every_provider_is_measured_and_the_table_prints() -> None:
    costs = asyncio.run(providers.measure(10_000, requests=3, pace_s=0.0, stream=True))
    assert list(costs.cpu_ms) == list(providers.PROVIDERS)
    assert all(math.isfinite(ms) and ms > 0 for ms in costs.cpu_ms.values())
    assert costs.ratio("anthropic") == 1.0
    table = providers.format_costs(costs)
    assert table.count("\n") == len(providers.PROVIDERS) + 1 and "bedrock" in table
