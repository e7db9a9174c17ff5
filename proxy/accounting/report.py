"""``compact-proxy report``: the usage ledger's rows priced and laid out, as a table or JSON.

A model without a price shows its tokens and no cost (``n/a``, JSON ``null``), never a guessed
one; the total adds every row's tokens and the priced rows' costs. No I/O here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from proxy.accounting.usage import (
    PREPARED_ROW,
    PREPARED_USED_ROW,
    Price,
    UsageCost,
    UsageEntry,
    UsageRow,
    usage_cost,
)
from proxy.audit.report import aligned_table

__all__ = ["PreparedSummaries", "Report", "ReportLine", "build_report"]

#: Decimals of the dollar figures in JSON, and in the table.
JSON_DECIMALS: Final = 6
TEXT_DECIMALS: Final = 4


@dataclass(frozen=True)
class ReportLine:
    """One line of the report: a ledger row, or the total (``TOTAL``, no model, no
    ``last_seen``), and its cost (``None``: no price; for the total, no row has one)."""

    session_key: str
    model: str
    entry: UsageEntry
    cost: UsageCost | None
    last_seen: datetime | None = None

    def as_json(self) -> dict[str, Any]:
        """The line as plain JSON data: every counter, then the costs (``null`` unpriced)."""
        cost = self.cost
        out: dict[str, Any] = {}
        if self.last_seen is not None:
            out = {"session": self.session_key, "model": self.model,
                   "last_seen": self.last_seen.isoformat()}
        out.update({name: getattr(self.entry, name) for name in UsageEntry.field_names()})
        out.update({
            "cost_billed": _usd(cost.billed if cost else None),
            "cost_summary": _usd(cost.summary if cost else None),
            "cost_without_proxy": _usd(cost.without_proxy if cost else None),
            "net_saving": _usd(cost.net_saving if cost else None),
            "saving_percent": _percent(cost),
        })
        return out


@dataclass(frozen=True)
class Report:
    """Every priced line, the total, and the models that have no price."""

    lines: tuple[ReportLine, ...]
    total: ReportLine
    unpriced_models: tuple[str, ...]
    prepared: PreparedSummaries | None = None

    def as_json(self) -> dict[str, Any]:
        """``{"sessions": [...], "total": {...}}``; the total also lists the unpriced models;
        ``prepared`` says what summaries made ahead cost, when there were any."""
        out: dict[str, Any] = {
            "sessions": [line.as_json() for line in self.lines],
            "total": {**self.total.as_json(), "unpriced_models": list(self.unpriced_models)}}
        if self.prepared is not None:
            out["prepared"] = self.prepared.as_json()
        return out

    def as_text(self) -> str:
        """The report as an aligned table, one line per row, then ``TOTAL``."""
        text = aligned_table(_HEADER, [_cells(line) for line in (*self.lines, self.total)],
                             left=2)
        if self.unpriced_models:
            text += (f"n/a: no price for {', '.join(self.unpriced_models)} (add it under "
                     "prices: in the config); its tokens are in the total, not its costs\n")
        if self.prepared is not None:
            text += self.prepared.as_text()
        return text


@dataclass(frozen=True)
class PreparedSummaries:
    """Summaries made ahead (``summary.prepare_at``), all of them paid (their
    ``<session>#prepared`` rows are in the table and the total), and those no crossing used."""

    all: UsageEntry
    used: UsageEntry

    @staticmethod
    def _tokens(entry: UsageEntry) -> int:
        return (entry.summary_input_tokens + entry.summary_cache_read_tokens
                + entry.summary_cache_write_tokens + entry.summary_output_tokens)

    def as_json(self) -> dict[str, int]:
        """Calls and tokens, made and never used."""
        return {"calls": self.all.summary_calls, "tokens": self._tokens(self.all),
                "unused_calls": max(0, self.all.summary_calls - self.used.summary_calls),
                "unused_tokens": max(0, self._tokens(self.all) - self._tokens(self.used))}

    def as_text(self) -> str:
        """One line."""
        figures = self.as_json()
        return (f"summaries made ahead: {figures['calls']:,} calls, {figures['tokens']:,} "
                f"tokens; never used: {figures['unused_calls']:,} calls, "
                f"{figures['unused_tokens']:,} tokens\n")


def build_report(rows: Iterable[UsageRow], price_for: Callable[[str], Price | None]) -> Report:
    """Price each row with ``price_for(model)`` and add them up (the rows of prepared
    summaries a crossing used repeat paid ones: they only tell the unused ones apart)."""
    lines = []
    prepared = used = UsageEntry()
    for row in rows:
        if row.session_key.endswith(PREPARED_USED_ROW):
            used = used + row.entry
            continue
        if row.session_key.endswith(PREPARED_ROW):
            prepared = prepared + row.entry
        price = price_for(row.model)
        lines.append(ReportLine(row.session_key, row.model, row.entry,
                                None if price is None else usage_cost(row.entry, price),
                                row.last_seen))
    total_entry = sum((line.entry for line in lines), UsageEntry())
    priced = [line.cost for line in lines if line.cost is not None]
    total_cost = None if lines and not priced else UsageCost(
        billed=sum(cost.billed for cost in priced),
        without_proxy=sum(cost.without_proxy for cost in priced),
        summary=sum(cost.summary for cost in priced),
    )
    unpriced = tuple(sorted({line.model for line in lines if line.cost is None}))
    made = PreparedSummaries(prepared, used) if prepared.summary_calls else None
    return Report(tuple(lines), ReportLine("TOTAL", "", total_entry, total_cost), unpriced,
                  made)


_HEADER: Final = (
    "SESSION", "MODEL", "REQUESTS", "TOKENS_NO_PROXY", "TOKENS_SENT", "INPUT", "CACHE_READ",
    "CACHE_WRITE", "OUTPUT", "SUMMARIES", "SUMMARY_USD", "BILLED_USD", "NO_PROXY_USD",
    "SAVED_USD", "SAVED_%",
)


def _cells(line: ReportLine) -> Sequence[str]:
    entry, cost = line.entry, line.cost

    def usd(value: float | None) -> str:
        return "n/a" if value is None else f"{value:,.{TEXT_DECIMALS}f}"

    percent = _percent(cost)
    return (
        line.session_key, line.model,
        *(f"{getattr(entry, name):,}" for name in (
            "requests", "tokens_without_proxy", "tokens_sent", "input_tokens",
            "cache_read_tokens", "cache_write_tokens", "output_tokens", "summary_calls")),
        usd(cost.summary if cost else None), usd(cost.billed if cost else None),
        usd(cost.without_proxy if cost else None), usd(cost.net_saving if cost else None),
        "n/a" if percent is None else f"{percent:.1f}%",
    )


def _usd(value: float | None) -> float | None:
    return None if value is None else round(value, JSON_DECIMALS) + 0.0  # no -0.0


def _percent(cost: UsageCost | None) -> float | None:
    ratio = None if cost is None else cost.saving_ratio
    return None if ratio is None else round(ratio * 100, 2) + 0.0
