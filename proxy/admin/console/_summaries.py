"""The L4 summaries of the requests a page shows, read from the summary cache by the key the
audit record keeps (never the text): a summary the cache has since evicted shows as gone."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from proxy.audit.log import RequestEntry
from proxy.store import SummaryCache

__all__ = ["SUMMARIES_SHOWN", "SummaryView", "summary_views"]

#: Distinct summaries read for one page.
SUMMARIES_SHOWN: Final = 20


@dataclass(frozen=True, slots=True)
class SummaryView:
    """One request's L4 summary: its text, or ``None`` when the cache no longer holds it."""

    request_id: str
    key: str
    text: str | None


async def summary_views(cache: SummaryCache | None,
                        entries: Sequence[RequestEntry]) -> list[SummaryView]:
    """The summaries of ``entries`` (newest first, as given) that made one, each key read
    once; nothing without a cache."""
    if cache is None:
        return []
    texts: dict[str, str | None] = {}
    views: list[SummaryView] = []
    for entry in entries:
        key = entry.summary_key
        if key is None:
            continue
        if key not in texts:
            if len(texts) >= SUMMARIES_SHOWN:
                continue
            texts[key] = await cache.get_summary(key)
        views.append(SummaryView(entry.request_id, key, texts[key]))
    return views
