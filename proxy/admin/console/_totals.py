"""What a request cost (its provider ``usage`` at its model's price, ``prices``) and what a
set of requests add up to, for the request tables and the overview."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from proxy.accounting.usage import Price, token_cost
from proxy.audit.log import RequestEntry

__all__ = ["PriceFor", "Totals", "request_cost", "totals"]

#: How the console finds a model's price (``Config.price_for``).
PriceFor = Callable[[str], Price | None]


def _has_usage(entry: RequestEntry) -> bool:
    return any(value is not None for value in (entry.usage_input, entry.usage_cache_read,
                                               entry.usage_cache_write, entry.usage_output))


def request_cost(entry: RequestEntry, price_for: PriceFor) -> float | None:
    """What ``entry`` cost in USD, from its usage at its model's price (``None``: no usage
    reported, or a model without a price)."""
    if not _has_usage(entry) or entry.model is None:
        return None
    price = price_for(entry.model)
    if price is None:
        return None
    return token_cost(price, input=entry.usage_input or 0,
                      cache_write=entry.usage_cache_write or 0,
                      cache_read=entry.usage_cache_read or 0, output=entry.usage_output or 0)


@dataclass(slots=True)
class Totals:
    """Requests added up: the known token counts and usage, the priced requests' cost in USD
    (``unpriced``: those with usage whose model has no price), requests per outcome."""

    requests: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    usage_input: int = 0
    usage_cache_read: int = 0
    usage_cache_write: int = 0
    usage_output: int = 0
    cost: float = 0.0
    unpriced: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)

    def add(self, entry: RequestEntry, cost: float | None) -> None:
        """Count ``entry``, which cost ``cost`` (:func:`request_cost`)."""
        self.requests += 1
        self.tokens_before += entry.tokens_before or 0
        self.tokens_after += entry.tokens_after or 0
        self.usage_input += entry.usage_input or 0
        self.usage_cache_read += entry.usage_cache_read or 0
        self.usage_cache_write += entry.usage_cache_write or 0
        self.usage_output += entry.usage_output or 0
        if cost is not None:
            self.cost += cost
        elif _has_usage(entry):
            self.unpriced += 1
        self.outcomes[entry.outcome or "unknown"] += 1

    @property
    def saved(self) -> int:
        """Tokens the compaction took out (before − after)."""
        return self.tokens_before - self.tokens_after

    @property
    def saved_ratio(self) -> float | None:
        """``1 - after / before``; ``None`` when nothing was counted."""
        return None if self.tokens_before <= 0 else self.saved / self.tokens_before

    @property
    def cache_share(self) -> float | None:
        """The share of the input tokens read from the prompt cache (``None``: no input)."""
        read = self.usage_input + self.usage_cache_read + self.usage_cache_write
        return None if read <= 0 else self.usage_cache_read / read


def totals(entries: Iterable[RequestEntry], price_for: PriceFor
           ) -> tuple[Totals, dict[str, float | None]]:
    """The totals of ``entries`` and each one's cost by request id."""
    total = Totals()
    costs: dict[str, float | None] = {}
    for entry in entries:
        cost = request_cost(entry, price_for)
        costs[entry.request_id] = cost
        total.add(entry, cost)
    return total, costs
