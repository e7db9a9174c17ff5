"""Tests for compact-proxy report: usage rows, totals and --json, on SQLite and Redis."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
import pytest

from proxy.accounting.usage import UsageEntry
from proxy.cli.commands import main
from proxy.store import RedisStateStore, SQLiteStateStore, StoreBackend
from tests.proxy.cli.helpers import (
    BAD_KEY_LINE,
    TENANT,
    _flush,
    _put,
    bad_config,
    run,
    scoped_config,
)

pytestmark = pytest.mark.slow


# ------------------------------------------------------------------------------ report

OPUS = "claude-opus-4-5-20251101"
OPUS_ENTRY = UsageEntry(
    requests=4, tokens_without_proxy=541_000, tokens_sent=115_000,
    input_tokens=2_000, cache_write_tokens=10_000, cache_read_tokens=100_000,
    output_tokens=3_000, counterfactual_input_tokens=1_000,
    counterfactual_cache_write_tokens=40_000, counterfactual_cache_read_tokens=400_000,
)
SUMMARY_ENTRY = UsageEntry(summary_calls=1, summary_input_tokens=20_000,
                           summary_output_tokens=1_000)
UNPRICED_ENTRY = UsageEntry(requests=1, tokens_without_proxy=10, tokens_sent=10,
                            input_tokens=10, output_tokens=5, counterfactual_input_tokens=10)
# By hand, Opus 4.5 at 5 / 6.25 / 0.50 / 25 USD per million:
#   billed   2000*5 + 10000*6.25 + 100000*0.5 + 3000*25 = 197500  -> 0.1975
#   without  1000*5 + 40000*6.25 + 400000*0.5 + 3000*25 = 530000  -> 0.53
# Haiku 4.5 summaries at 1 / 1.25 / 0.10 / 5: 20000*1 + 1000*5 = 25000 -> 0.025
# Total saving: 0.53 - (0.1975 + 0.025) = 0.3075, 58.02 % of 0.53.


def _add_usage(store: StoreBackend) -> None:
    """Three rows: demo-session's Opus 4.5 requests (added in two parts) and Haiku summaries,
    and a tenant's session on a model without a price."""
    first = UsageEntry(requests=1, input_tokens=2_000, output_tokens=1_000)
    rest = UsageEntry(**{name: getattr(OPUS_ENTRY, name) - getattr(first, name)
                         for name in UsageEntry.field_names()})

    async def go() -> None:
        await store.open()
        try:
            await store.add_usage("demo-session", OPUS, first)
            await store.add_usage("demo-session", OPUS, rest)
            await store.add_usage("demo-session", "claude-haiku-4-5", SUMMARY_ENTRY)
            await store.add_usage(f"{TENANT}/sess-1", "gpt-5", UNPRICED_ENTRY)
        finally:
            await store.close()

    asyncio.run(go())


def test_report_on_an_empty_store_says_so_and_exits_0(tmp_path: Path) -> None:
    """No usage yet: one line, exit 0, and no database file is created by looking."""
    result = run(["report", "--config", str(scoped_config(tmp_path, None))], tmp_path)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == "no usage recorded yet\n"
    assert not (tmp_path / "state").exists()
    _put(tmp_path / "state" / "state.db", "sess-1", "a state but no usage")
    result = run(["report", "--config", str(scoped_config(tmp_path, None))], tmp_path)
    assert (result.returncode, result.stdout) == (0, "no usage recorded yet\n")


def test_report_prints_each_row_then_the_total(tmp_path: Path) -> None:
    """The table: one line per (session, model) with its tokens and costs, then TOTAL;
    a model without a price shows n/a and is named below the table."""
    path = scoped_config(tmp_path, None)
    _add_usage(SQLiteStateStore(tmp_path / "state" / "state.db"))
    result = run(["report", "--config", str(path)], tmp_path)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "SESSION", "MODEL", "REQUESTS", "TOKENS_NO_PROXY", "TOKENS_SENT", "INPUT",
        "CACHE_READ", "CACHE_WRITE", "OUTPUT", "SUMMARIES", "SUMMARY_USD", "BILLED_USD",
        "NO_PROXY_USD", "SAVED_USD", "SAVED_%",
    ]
    rows = {tuple(line.split()[:2]): line.split()[2:] for line in lines[1:4]}
    assert rows[("demo-session", OPUS)] == [
        "4", "541,000", "115,000", "2,000", "100,000", "10,000", "3,000", "0",
        "0.0000", "0.1975", "0.5300", "0.3325", "62.7%",
    ]
    assert rows[("demo-session", "claude-haiku-4-5")] == [
        "0", "0", "0", "0", "0", "0", "0", "1", "0.0250", "0.0000", "0.0000", "-0.0250", "n/a",
    ]
    assert rows[(f"{TENANT}/sess-1", "gpt-5")] == [
        "1", "10", "10", "10", "0", "0", "5", "0", "n/a", "n/a", "n/a", "n/a", "n/a",
    ]
    assert lines[4].split() == [
        "TOTAL", "5", "541,010", "115,010", "2,010", "100,000", "10,000", "3,005", "1",
        "0.0250", "0.1975", "0.5300", "0.3075", "58.0%",
    ]
    assert lines[5].startswith("n/a: no price for gpt-5") and len(lines) == 6


def test_report_json_has_the_same_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--json: one object, every counter of each row, costs rounded to 6 decimals, null
    where the model has no price; a prices: entry in the config prices it."""
    path = scoped_config(tmp_path, None)
    _add_usage(SQLiteStateStore(tmp_path / "state" / "state.db"))
    assert main(["report", "--config", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(row["session"], row["model"]) for row in data["sessions"]] == [
        ("demo-session", "claude-haiku-4-5"), ("demo-session", OPUS), (f"{TENANT}/sess-1", "gpt-5"),
    ]
    opus = data["sessions"][1]
    assert {name: opus[name] for name in UsageEntry.field_names()} == msgspec.structs.asdict(
        OPUS_ENTRY)
    assert (opus["cost_billed"], opus["cost_summary"], opus["cost_without_proxy"],
            opus["net_saving"], opus["saving_percent"]) == (0.1975, 0.0, 0.53, 0.3325, 62.74)
    assert opus["last_seen"].endswith("+00:00")
    gpt = data["sessions"][2]
    assert [gpt[key] for key in ("cost_billed", "cost_summary", "cost_without_proxy",
                                 "net_saving", "saving_percent")] == [None] * 5
    total = data["total"]
    assert (total["requests"], total["summary_calls"], total["output_tokens"]) == (5, 1, 3_005)
    assert (total["cost_billed"], total["cost_summary"], total["cost_without_proxy"],
            total["net_saving"], total["saving_percent"]) == (0.1975, 0.025, 0.53, 0.3075, 58.02)
    assert total["unpriced_models"] == ["gpt-5"]

    priced = tmp_path / "priced.yaml"
    priced.write_text(path.read_text(encoding="utf-8") + (
        "prices: {gpt-5: {input: 1000, cache_write: 0, cache_read: 0, output: 2000}}\n"),
        encoding="utf-8")
    assert main(["report", "--config", str(priced), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    # 10*1000 + 5*2000 = 20000 -> 0.02 billed; 10*1000 + 5*2000 -> 0.02 without the proxy.
    assert (data["sessions"][2]["cost_billed"], data["sessions"][2]["net_saving"]) == (0.02, 0.0)
    assert data["total"]["unpriced_models"] == []
    assert data["total"]["cost_billed"] == 0.2175


def test_report_session_filter_matches_the_id_under_any_tenant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--session SID keeps the rows of that session id (any tenant) or store key."""
    path = scoped_config(tmp_path, None)
    _add_usage(SQLiteStateStore(tmp_path / "state" / "state.db"))
    for sid, expected in (("sess-1", [f"{TENANT}/sess-1"]), (f"{TENANT}/sess-1",
                                                              [f"{TENANT}/sess-1"]),
                          ("demo-session", ["demo-session", "demo-session"])):
        assert main(["report", "--config", str(path), "--json", "--session", sid]) == 0
        data = json.loads(capsys.readouterr().out)
        assert [row["session"] for row in data["sessions"]] == expected
    assert main(["report", "--config", str(path), "--session", "other"]) == 0
    assert capsys.readouterr().out == "no usage recorded for session other\n"
    # --tenant addresses one tenant's session, as `session SID --tenant T` does.
    for tenant, expected in ((TENANT, [f"{TENANT}/sess-1"]), ("none", [])):
        assert main(["report", "--config", str(path), "--json", "--session", "sess-1",
                     "--tenant", tenant]) == 0
        data = json.loads(capsys.readouterr().out)
        assert [row["session"] for row in data["sessions"]] == expected


def test_report_with_a_bad_config_exits_2(tmp_path: Path) -> None:
    result = run(["report", "--config", str(bad_config(tmp_path))], tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines() == [BAD_KEY_LINE]


def test_report_reads_a_redis_store(
    tmp_path: Path, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """store.backend redis: the same figures, read from the server the config names."""
    url = redis_url.rsplit("/", 1)[0] + "/9"  # a database of its own, under the default prefix
    asyncio.run(_flush(url))
    path = tmp_path / "redis.yaml"
    path.write_text("upstream: {base_url: 'https://api.anthropic.com'}\n"
                    f"store: {{backend: redis, url: '{url}'}}\n", encoding="utf-8")
    _add_usage(RedisStateStore(url))
    assert main(["report", "--config", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["sessions"]) == 3
    assert (data["total"]["net_saving"], data["total"]["saving_percent"]) == (0.3075, 58.02)
