"""What the provider billed, per session and model: the figures behind ``compact-proxy report``.

Every answered ``/v1/messages`` request adds one :class:`UsageEntry` to its session's totals
(every L4 summary call one with only the ``summary_*`` fields set); a store only adds them up.
The *counterfactual* fields are what the same requests would have been billed without the
proxy, the client's best case (docs/operations.md, "What it saved"); :func:`usage_cost` prices
both at USD per million tokens.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Protocol

import msgspec

__all__ = ["PREPARED_ROW", "PREPARED_USED_ROW", "Price", "ProviderUsage", "UsageCost", "UsageEntry",
           "UsageRow", "token_cost", "usage_cost"]

#: Prices are quoted per this many tokens.
TOKENS_PER_PRICE_UNIT: Final = 1_000_000


class ProviderUsage(msgspec.Struct, frozen=True):
    """The ``usage`` of one provider answer: ``input_tokens``, ``cache_read_input_tokens``,
    ``cache_creation_input_tokens``, ``output_tokens`` (in a stream, from ``message_delta``)."""

    input: int = 0
    cache_read: int = 0
    cache_write: int = 0
    output: int = 0

    @property
    def prompt_tokens(self) -> int:
        """The whole prompt as the provider counted it: input + cache read + cache write."""
        return self.input + self.cache_read + self.cache_write

    @classmethod
    def from_usage(cls, usage: Mapping[str, Any], previous: ProviderUsage | None = None
                   ) -> ProviderUsage:
        """Read a ``usage`` object; a field missing or null keeps ``previous``'s value (a
        stream's ``message_delta`` repeats only what changed)."""
        values: tuple[Any, ...] = tuple(map(usage.get, _USAGE_NAMES))
        if set(map(type, values)) == _INTS and min(values) >= 0:
            return cls(*values)  # the usual whole usage, tested in C loops
        base = previous if previous is not None else cls()
        return cls(*(value if type(value) is int and value >= 0 else current  # (not a bool)
                     for value, current in zip(values, _counts_of(base), strict=True)))


#: The provider's names of :class:`ProviderUsage`'s fields, in their order.
_USAGE_NAMES: Final = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens",
                       "output_tokens")
_counts_of: Final = operator.attrgetter(*ProviderUsage.__struct_fields__)
_INTS: Final = frozenset({int})


class UsageEntry(msgspec.Struct, frozen=True):
    """Additive per-(session, model) counters, all integers >= 0: the client's requests
    (``tokens_without_proxy``: their histories as the provider would count them), what they
    were billed, what they would have been billed without the proxy (``counterfactual_*``), and
    the L4 summary calls made (cache hits are not calls) with what they were billed."""

    requests: int = 0
    tokens_without_proxy: int = 0
    tokens_sent: int = 0
    input_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0
    counterfactual_input_tokens: int = 0
    counterfactual_cache_read_tokens: int = 0
    counterfactual_cache_write_tokens: int = 0
    summary_calls: int = 0
    summary_input_tokens: int = 0
    summary_cache_read_tokens: int = 0
    summary_cache_write_tokens: int = 0
    summary_output_tokens: int = 0

    def __post_init__(self) -> None:
        values = _counters_of(self)
        if set(map(type, values)) == {int} and min(values) >= 0:
            return  # the usual case, tested in C loops
        for name, value in zip(_COUNTERS, values, strict=True):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")

    def __add__(self, other: UsageEntry) -> UsageEntry:
        return UsageEntry(*map(operator.add, _counters_of(self), _counters_of(other)))

    @classmethod
    def total(cls, entries: Sequence[UsageEntry]) -> UsageEntry:
        """The sum of ``entries`` (at least one), made as one entry."""
        if len(entries) == 1:
            return entries[0]
        return cls(*map(sum, zip(*map(_counters_of, entries), strict=True)))

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The counters, in declaration order (the stores' column / hash-field names)."""
        return _COUNTERS


#: :meth:`UsageEntry.field_names`.
_COUNTERS: Final = UsageEntry.__struct_fields__
#: An entry's counters as a tuple, in :data:`_COUNTERS` order.
_counters_of: Final = operator.attrgetter(*_COUNTERS)


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One (session key, model) row of the ledger as a store returns it (``last_seen``: UTC)."""

    session_key: str
    model: str
    entry: UsageEntry
    last_seen: datetime


class Price(Protocol):
    """What a model costs, in USD per million tokens of each billing kind
    (``proxy.config.ModelPrice`` is one)."""

    @property
    def input(self) -> float: ...

    @property
    def cache_write(self) -> float: ...

    @property
    def cache_read(self) -> float: ...

    @property
    def output(self) -> float: ...


@dataclass(frozen=True, slots=True)
class UsageCost:
    """The cost of one :class:`UsageEntry` at one price, in USD: as billed, without the proxy
    (the counterfactual tokens plus the same output), and of the summary calls."""

    billed: float
    without_proxy: float
    summary: float

    @property
    def net_saving(self) -> float:
        """``without_proxy - (billed + summary)``; negative when the proxy cost money."""
        return self.without_proxy - (self.billed + self.summary)

    @property
    def saving_ratio(self) -> float | None:
        """:attr:`net_saving` as a fraction of :attr:`without_proxy`; ``None`` when that is 0."""
        if self.without_proxy == 0:
            return None
        return self.net_saving / self.without_proxy


def token_cost(price: Price, *, input: int, cache_write: int, cache_read: int,
               output: int) -> float:
    """What these tokens cost at ``price``, in USD."""
    micro_usd = (input * price.input + cache_write * price.cache_write
                 + cache_read * price.cache_read + output * price.output)
    return micro_usd / TOKENS_PER_PRICE_UNIT


def usage_cost(entry: UsageEntry, price: Price) -> UsageCost:
    """What ``entry`` cost, would have cost without the proxy, and what its summaries cost."""
    return UsageCost(
        billed=token_cost(price, input=entry.input_tokens,
                          cache_write=entry.cache_write_tokens,
                          cache_read=entry.cache_read_tokens, output=entry.output_tokens),
        without_proxy=token_cost(price, input=entry.counterfactual_input_tokens,
                                 cache_write=entry.counterfactual_cache_write_tokens,
                                 cache_read=entry.counterfactual_cache_read_tokens,
                                 output=entry.output_tokens),
        summary=token_cost(price, input=entry.summary_input_tokens,
                           cache_write=entry.summary_cache_write_tokens,
                           cache_read=entry.summary_cache_read_tokens,
                           output=entry.summary_output_tokens),
    )


#: Ledger rows of summaries made ahead (``summary.prepare_at``): ``<session key>#prepared``
#: holds every preparation's calls (paid, in the totals); ``<session key>#prepared-used``
#: repeats those a crossing used (left out of the totals: the report's unused ones are the
#: difference).
PREPARED_ROW: Final = "#prepared"
PREPARED_USED_ROW: Final = "#prepared-used"
