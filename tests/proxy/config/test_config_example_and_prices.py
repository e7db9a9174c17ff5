"""Tests for proxy.config: config.example.yaml and the model price table."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.config import (
    DEFAULT_PRICES,
    Config,
    ConfigError,
    ModelPrice,
    UpstreamConfig,
    load_config,
)
from tests.proxy.config.helpers import EXAMPLE, UPSTREAM, write

# ------------------------------------------------------------------------------ the example


def test_example_config_loads_with_the_default_values() -> None:
    """config.example.yaml is valid and equals the defaults plus the Anthropic base URL."""
    config = load_config(EXAMPLE)
    assert config == Config.from_mapping(UPSTREAM)
    assert config.upstream == UpstreamConfig(base_url="https://api.anthropic.com")


def test_example_config_documents_every_key() -> None:
    """Every field of every section appears in the example, right after a comment."""
    lines = EXAMPLE.read_text(encoding="utf-8").splitlines()
    data = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    for section, values in Config().as_dict().items():
        if section == "policies":
            continue
        assert set(data[section]) == set(values), section
    for index, line in enumerate(lines):
        if re.match(r"^  [a-z_]+:", line):
            previous = lines[index - 1].strip()
            assert previous.startswith("#"), f"key without a comment: {line.strip()}"


def test_example_policies_block_is_valid() -> None:
    """The commented `policies:` example, uncommented, is a valid policies section."""
    text = EXAMPLE.read_text(encoding="utf-8")
    block = text[text.index("# policies:\n") :]
    uncommented = "\n".join(line[2:] for line in block.splitlines())
    data: dict[str, Any] = yaml.safe_load(uncommented)
    config = Config.from_mapping({**UPSTREAM, **data})
    roles = config.role_policies()
    assert roles.policy_for("subagent").soft_threshold_tokens == 40_000
    assert len(roles.rules) == 3
    assert roles.select({"x-compact-role": "summary-recovery"}, None)[0] == "summary_recovery"
    assert [tool.name for tool in config.policies.read_tools] == [
        "Read",
        "str_replace_based_edit_tool",
    ]
    assert config.source_access().shared_sessions == ("team-notes",)


# ------------------------------------------------------------------------------ prices

OPUS_4_5 = ModelPrice(input=5, cache_write=6.25, cache_read=0.5, output=25)


def test_default_prices_are_the_built_in_table() -> None:
    """Without a prices section every built-in family has its list price."""
    config = Config.from_mapping(UPSTREAM)
    assert dict(config.prices) == dict(DEFAULT_PRICES)
    assert set(config.prices) == {
        "claude-opus-5-5", "claude-opus-5", "claude-opus-4-8", "claude-opus-4-7",
        "claude-opus-4-6", "claude-opus-4-5", "claude-opus-4-1", "claude-opus-4",
        "claude-sonnet-4-6", "claude-sonnet-4-5", "claude-sonnet-4", "claude-3-7-sonnet",
        "claude-haiku-4-5", "claude-3-5-haiku",
    }
    assert config.prices["claude-opus-4-5"] == OPUS_4_5
    assert config.prices["claude-opus-4"] == ModelPrice(input=15, cache_write=18.75,
                                                        cache_read=1.5, output=75)
    assert config.prices["claude-sonnet-4-5"] == ModelPrice(input=3, cache_write=3.75,
                                                            cache_read=0.3, output=15)
    assert config.prices["claude-3-5-haiku"] == ModelPrice(input=0.8, cache_write=1.0,
                                                           cache_read=0.08, output=4)
    for price in config.prices.values():  # 5-minute cache writes cost 1.25 x input
        assert price.cache_write == pytest.approx(price.input * 1.25)
    assert Config.from_mapping({**UPSTREAM, "prices": None}).prices == config.prices


def test_price_is_the_longest_family_that_prefixes_the_model() -> None:
    """claude-opus-4-5-… is Opus 4.5, claude-opus-4-2025… Opus 4; no family: no price."""
    config = Config.from_mapping(UPSTREAM)
    assert config.price_for("claude-opus-4-5-20251101") == OPUS_4_5
    assert config.price_for("claude-opus-4-5") == OPUS_4_5
    assert config.price_for("claude-opus-4-1-20250805") == config.prices["claude-opus-4-1"]
    assert config.price_for("claude-opus-4-20250514") == config.prices["claude-opus-4"]
    assert config.price_for("claude-sonnet-4-5-20250929") == config.prices["claude-sonnet-4-5"]
    assert config.price_for("claude-haiku-4-5") == config.prices["claude-haiku-4-5"]
    # Claude Code's default model (2.1: claude-opus-4-8) and its neighbours are priced.
    for model in ("claude-opus-4-8", "claude-opus-4-7", "claude-opus-4-6", "claude-opus-5"):
        assert config.price_for(model) == OPUS_4_5
    assert config.price_for("claude-sonnet-4-6") == config.prices["claude-sonnet-4-5"]
    assert config.price_for("claude-opus-5-5") == ModelPrice(input=4, cache_write=5,
                                                             cache_read=0.2, output=20)
    for unknown in ("gpt-5", "claude-opus", "claude-2.1", ""):
        assert config.price_for(unknown) is None


def test_user_prices_replace_their_family_and_add_new_ones(tmp_path: Path) -> None:
    """A listed family replaces the built-in entry, a new one is added, the rest are kept."""
    config = load_config(write(tmp_path, """\
        upstream: {base_url: 'https://api.anthropic.com'}
        prices:
          claude-opus-4-5: {input: 4, cache_write: 5, cache_read: 0.4, output: 20}
          claude-opus-4-5-fast: {input: 0, cache_write: 0, cache_read: 0, output: 1}
          my-model: {input: 1.5, cache_write: 2, cache_read: 0.1, output: 6}
        """))
    assert config.prices["claude-opus-4-5"] == ModelPrice(input=4, cache_write=5,
                                                          cache_read=0.4, output=20)
    assert config.prices["claude-sonnet-4"] == DEFAULT_PRICES["claude-sonnet-4"]
    assert len(config.prices) == len(DEFAULT_PRICES) + 2
    assert config.price_for("my-model-v2") == ModelPrice(input=1.5, cache_write=2,
                                                         cache_read=0.1, output=6)
    assert config.price_for("claude-opus-4-5-fast-20260101") == ModelPrice(
        input=0, cache_write=0, cache_read=0, output=1)
    assert config.price_for("claude-opus-4-5-20251101").input == 4  # type: ignore[union-attr]
    # A model that only begins with a family is another model: unpriced, never mispriced.
    assert config.price_for("claude-opus-4-5-fast-1") is None
    assert config.price_for("claude-opus-4-9") is None
    assert config.price_for("claude-opus-4-20250514") == DEFAULT_PRICES["claude-opus-4"]
    with pytest.raises(TypeError):
        config.prices["x"] = OPUS_4_5  # type: ignore[index]
    data = config.as_dict()
    assert data["prices"]["my-model"] == {"input": 1.5, "cache_write": 2.0, "cache_read": 0.1,
                                          "output": 6.0}
    assert Config.from_mapping(yaml.safe_load(yaml.safe_dump(data))).prices == config.prices


@pytest.mark.parametrize(
    ("snippet", "key", "fragment"),
    [
        ("prices: {claude-opus-4-5: {input: -1, cache_write: 1, cache_read: 1, output: 1}}",
         "prices.claude-opus-4-5.input", "must be >= 0 (USD per million tokens), got -1"),
        ("prices: {m: {input: 1, cache_write: 1, cache_read: 1, output: -0.5}}",
         "prices.m.output", "must be >= 0"),
        ("prices: {m: {input: '3', cache_write: 1, cache_read: 1, output: 1}}",
         "prices.m.input", "must be a number (USD per million tokens), got '3' (a string)"),
        ("prices: {m: {input: true, cache_write: 1, cache_read: 1, output: 1}}",
         "prices.m.input", "must be a number"),
        ("prices: {m: {input: .nan, cache_write: 1, cache_read: 1, output: 1}}",
         "prices.m.input", "must be a finite number"),
        ("prices: {m: {input: 1, cache_read: 1, output: 1}}", "prices.m.cache_write",
         "required"),
        ("prices: {m: {input: 1, cache_write: 1, cache_read: 1, output: 1, cache_wrte: 1}}",
         "prices.m.cache_wrte", "unknown key (did you mean 'cache_write'?)"),
        ("prices: {m: 3}", "prices.m", "must be a mapping"),
        ("prices: [a]", "prices", "must be a mapping, got a list"),
        ("prices: {1: {input: 1, cache_write: 1, cache_read: 1, output: 1}}", "prices",
         "keys must be non-empty strings, got 1"),
    ],
)
def test_bad_prices_are_one_line_errors_naming_the_key(
    tmp_path: Path, snippet: str, key: str, fragment: str
) -> None:
    """A bad price is one ConfigError naming prices.<family>.<kind>."""
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, snippet), require_upstream=False)
    assert (info.value.key, "\n" in str(info.value)) == (key, False)
    assert fragment in info.value.problem
    assert str(info.value).startswith(f"config error: {key}: ")


def test_example_config_lists_the_built_in_prices() -> None:
    """config.example.yaml's prices section is exactly the built-in table."""
    data = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    assert Config.from_mapping({**UPSTREAM, "prices": data["prices"]}).prices == DEFAULT_PRICES
    assert set(data["prices"]) == set(DEFAULT_PRICES)
