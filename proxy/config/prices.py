"""Model prices: the ``prices`` section, the built-in table and how a model finds its price.

Edit :data:`DEFAULT_PRICES` when Anthropic's list prices change; a deployment overrides or
extends it with the ``prices`` section (for ``compact-proxy report``).
"""

from __future__ import annotations

import math
import re
import types
from collections.abc import Mapping
from typing import Annotated, Any, Final

from pydantic import AfterValidator, BeforeValidator, PlainValidator, ValidationInfo

from policies._compaction import Text, invalid
from proxy.config._base import Kind, Section, doc, section
from proxy.config._errors import shown


def _usd_per_million(value: object, info: ValidationInfo) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid(info.field_name, f"must be a number (USD per million tokens), got "
                                       f"{shown(value)}")
    if not math.isfinite(value):
        raise invalid(info.field_name, f"must be a finite number, got {value}")
    if value < 0:
        raise invalid(info.field_name, f"must be >= 0 (USD per million tokens), got {value}")
    return float(value)


#: A price: a finite number >= 0 of US dollars per million tokens.
UsdPerMillion = Annotated[float, PlainValidator(_usd_per_million),
                          Kind("USD per million tokens, a number >= 0")]


@section("prices")
class ModelPrice(Section):
    """``prices.<family>``: what one model family costs. Every key is required: an entry
    replaces the built-in one of its family as a whole."""

    input: UsdPerMillion = doc(..., "Plain input tokens.")
    cache_write: UsdPerMillion = doc(..., (
        "Prompt-cache writes (5-minute cache: 1.25 × input at Anthropic)."))
    cache_read: UsdPerMillion = doc(..., "Prompt-cache reads.")
    output: UsdPerMillion = doc(..., "Output tokens.")


#: The built-in price table (Anthropic's list prices, USD per million tokens): model family
#: (a prefix of model names) -> its price.
DEFAULT_PRICES: Mapping[str, ModelPrice] = types.MappingProxyType({
    "claude-opus-5-5": ModelPrice(4, 5, 0.20, 20),
    "claude-opus-5": ModelPrice(5, 6.25, 0.50, 25),
    "claude-opus-4-8": ModelPrice(5, 6.25, 0.50, 25),  # Claude Code 2.1's default model
    "claude-opus-4-7": ModelPrice(5, 6.25, 0.50, 25),
    "claude-opus-4-6": ModelPrice(5, 6.25, 0.50, 25),
    "claude-opus-4-5": ModelPrice(5, 6.25, 0.50, 25),
    "claude-sonnet-4-6": ModelPrice(3, 3.75, 0.30, 15),
    "claude-opus-4-1": ModelPrice(15, 18.75, 1.50, 75),
    "claude-opus-4": ModelPrice(15, 18.75, 1.50, 75),
    "claude-sonnet-4-5": ModelPrice(3, 3.75, 0.30, 15),
    "claude-sonnet-4": ModelPrice(3, 3.75, 0.30, 15),
    "claude-3-7-sonnet": ModelPrice(3, 3.75, 0.30, 15),
    "claude-haiku-4-5": ModelPrice(1, 1.25, 0.10, 5),
    "claude-3-5-haiku": ModelPrice(0.80, 1.00, 0.08, 4),
})


def _over_default_prices(data: Any) -> Any:
    # The user's families replace or extend the built-in ones; null means the defaults.
    if data is None:
        return dict(DEFAULT_PRICES)
    if isinstance(data, Mapping):
        return {**DEFAULT_PRICES, **data}
    return data


#: The ``prices`` section: the built-in table with the user's entries merged over it.
Prices = Annotated[Mapping[Text, ModelPrice], BeforeValidator(_over_default_prices),
                   AfterValidator(types.MappingProxyType)]

#: What may follow a model family in a model name of that family: a snapshot date, ``-latest``
#: or a provider's version tag (``@20251101``, ``-v1:0``).
_SNAPSHOT_SUFFIX: Final = re.compile(r"(-\d{8}|-latest|@\d{8}|-v\d+(:\d+)?)+")


def price_for(prices: Mapping[str, ModelPrice], model: str) -> ModelPrice | None:
    """The price of ``model``: that of the family it is, or a dated or ``-latest`` snapshot
    of (``claude-opus-4-5-20251101`` -> ``claude-opus-4-5``); ``None`` when it is none of
    them. A newer model (``claude-opus-4-6``) is never priced as an older family it only
    begins with (``claude-opus-4``): it shows as unpriced instead."""
    for family in sorted(prices, key=len, reverse=True):
        if model == family or (model.startswith(family)
                               and _SNAPSHOT_SUFFIX.fullmatch(model[len(family):])):
            return prices[family]
    return None
