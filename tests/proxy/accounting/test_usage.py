"""Tests for proxy.accounting.usage: the usage counters and the cost arithmetic of the report,
checked against figures computed by hand."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from proxy.accounting.usage import ProviderUsage, UsageCost, UsageEntry, usage_cost
from proxy.config import DEFAULT_PRICES


@dataclass(frozen=True)
class Price:
    """A price as the cost functions see it (proxy.config.ModelPrice is one too)."""

    input: float
    cache_write: float
    cache_read: float
    output: float


OPUS_4_5 = Price(input=5, cache_write=6.25, cache_read=0.5, output=25)


def test_usage_entries_add_counter_by_counter() -> None:
    """``+`` sums each counter; field_names lists them in declaration order."""
    a = UsageEntry(requests=1, input_tokens=10, summary_calls=1)
    b = UsageEntry(requests=2, input_tokens=5, output_tokens=7)
    assert a + b == UsageEntry(requests=3, input_tokens=15, output_tokens=7, summary_calls=1)
    names = UsageEntry.field_names()
    assert names[:3] == ("requests", "tokens_without_proxy", "tokens_sent")
    assert len(names) == 15 and names[-1] == "summary_output_tokens"


@pytest.mark.parametrize("value", [-1, 1.5, True, "3", None])
def test_usage_entry_counters_are_non_negative_integers(value: object) -> None:
    """A counter that is not an int >= 0 is a ValueError naming the field."""
    with pytest.raises(ValueError, match="cache_read_tokens must be an integer >= 0"):
        UsageEntry(cache_read_tokens=value)  # type: ignore[arg-type]


def test_provider_usage_reads_the_usage_object_and_keeps_missing_fields() -> None:
    """from_usage maps the provider's field names; a missing or null field keeps previous."""
    first = ProviderUsage.from_usage({"input_tokens": 12, "cache_read_input_tokens": 3_000,
                                      "cache_creation_input_tokens": 400, "output_tokens": 1})
    assert first == ProviderUsage(input=12, cache_read=3_000, cache_write=400, output=1)
    assert first.prompt_tokens == 3_412
    delta = ProviderUsage.from_usage({"output_tokens": 250, "input_tokens": None}, first)
    assert delta == ProviderUsage(input=12, cache_read=3_000, cache_write=400, output=250)


@pytest.mark.parametrize("odd", [True, -1, 2.0, "7", [1], None])
def test_provider_usage_keeps_the_previous_count_for_a_value_that_is_not_a_count(
        odd: object) -> None:
    """A bool, a negative, a float, a string or a list where a count belongs is not read: the
    previous value stays (0 without one); the other fields are read."""
    before = ProviderUsage(input=5, cache_read=6, cache_write=7, output=8)
    usage = {"input_tokens": odd, "cache_read_input_tokens": 1,
             "cache_creation_input_tokens": 2, "output_tokens": 3}
    assert ProviderUsage.from_usage(usage, before) == ProviderUsage(5, 1, 2, 3)
    assert ProviderUsage.from_usage(usage) == ProviderUsage(0, 1, 2, 3)


def test_costs_of_requests_counterfactual_and_summaries_by_hand() -> None:
    """Each kind of token at its own price, per million tokens."""
    entry = UsageEntry(
        requests=4,
        input_tokens=2_000, cache_write_tokens=10_000, cache_read_tokens=100_000,
        output_tokens=3_000,
        counterfactual_input_tokens=1_000, counterfactual_cache_write_tokens=40_000,
        counterfactual_cache_read_tokens=400_000,
        summary_calls=1, summary_input_tokens=20_000, summary_output_tokens=1_000,
    )
    cost = usage_cost(entry, OPUS_4_5)
    # 2000*5 + 10000*6.25 + 100000*0.5 + 3000*25 = 10000 + 62500 + 50000 + 75000 = 197500
    assert cost.billed == pytest.approx(0.1975)
    # 1000*5 + 40000*6.25 + 400000*0.5 + 3000*25 (the same output) = 530000
    assert cost.without_proxy == pytest.approx(0.53)
    # 20000*5 + 1000*25 = 125000
    assert cost.summary == pytest.approx(0.125)
    # 0.53 - (0.1975 + 0.125)
    assert cost.net_saving == pytest.approx(0.2075)
    assert cost.saving_ratio == pytest.approx(0.2075 / 0.53)


def test_summary_cache_reads_and_writes_are_priced_too() -> None:
    """A summary call's cache read and write are billed at their own prices."""
    entry = UsageEntry(summary_calls=2, summary_cache_read_tokens=1_000_000,
                       summary_cache_write_tokens=200_000)
    cost = usage_cost(entry, OPUS_4_5)
    assert cost.summary == pytest.approx(0.5 + 0.2 * 6.25)  # 1.75
    assert (cost.billed, cost.without_proxy) == (0, 0)
    assert cost.net_saving == pytest.approx(-1.75)
    assert cost.saving_ratio is None


def test_a_cache_write_is_a_cost_never_a_saving() -> None:
    """More cache writes on the proxy's side cost more; more on the counterfactual side
    would have cost more; in no case does a write count as money saved."""
    base = UsageEntry(input_tokens=100, counterfactual_input_tokens=100)
    written = base + UsageEntry(cache_write_tokens=1_000_000)
    assert usage_cost(base, OPUS_4_5).net_saving == 0
    assert usage_cost(written, OPUS_4_5).billed == pytest.approx(0.0005 + 6.25)
    assert usage_cost(written, OPUS_4_5).net_saving == pytest.approx(-6.25)
    counterfactual = base + UsageEntry(counterfactual_cache_write_tokens=1_000_000)
    assert usage_cost(counterfactual, OPUS_4_5).without_proxy == pytest.approx(0.0005 + 6.25)
    assert usage_cost(counterfactual, OPUS_4_5).net_saving == pytest.approx(6.25)


def test_output_is_the_same_with_and_without_the_proxy() -> None:
    """Output tokens are billed on both sides alike, so they never change the saving."""
    entry = UsageEntry(output_tokens=1_000_000)
    cost = usage_cost(entry, OPUS_4_5)
    assert cost == UsageCost(billed=25.0, without_proxy=25.0, summary=0.0)
    assert cost.net_saving == 0 and cost.saving_ratio == 0


def test_the_config_price_table_works_with_the_cost_functions() -> None:
    """proxy.config.ModelPrice is a Price: Haiku 3.5's cache read at 0.08 per million."""
    entry = UsageEntry(cache_read_tokens=250_000, counterfactual_input_tokens=250_000)
    cost = usage_cost(entry, DEFAULT_PRICES["claude-3-5-haiku"])
    assert cost.billed == pytest.approx(0.02)
    assert cost.without_proxy == pytest.approx(0.2)
    assert cost.saving_ratio == pytest.approx(0.9)


def test_an_empty_entry_costs_nothing() -> None:
    """Zero tokens, zero cost, and no saving ratio (nothing to compare with)."""
    cost = usage_cost(UsageEntry(), OPUS_4_5)
    assert (cost.billed, cost.without_proxy, cost.summary, cost.net_saving) == (0, 0, 0, 0)
    assert cost.saving_ratio is None
