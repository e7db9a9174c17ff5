"""One answered request as the ledger counts it: billed tokens, and what no proxy would cost.

The counterfactual needs the previous request of the same conversation (without the proxy, a
client using the prompt cache would read that prompt from the cache and write only what is
new), so its size is remembered per conversation lane (bounded, least recently used go).
"""

from __future__ import annotations

import threading
from typing import Final

from cachetools import LRUCache

from proxy.accounting.usage import ProviderUsage, UsageEntry

__all__ = ["Accounting"]

#: Conversation lanes remembered.
MAX_LANES: Final = 50_000


class Accounting:
    """Builds ledger entries; remembers each lane's previous history size."""

    def __init__(self, *, max_lanes: int = MAX_LANES) -> None:
        self._previous: LRUCache[str, int] = LRUCache(max_lanes)
        self._lock = threading.Lock()

    def entry(self, session_key: str, lane: str, history_tokens: int, view_tokens: int,
              usage: ProviderUsage) -> UsageEntry:
        """The ledger entry of one answered request: ``usage`` billed for the view; the
        history (``history_tokens``, estimated like ``view_tokens``) as the provider would
        have counted it is taken at the ratio its count of the view showed."""
        tokens_without_proxy = round(history_tokens * usage.prompt_tokens / max(1, view_tokens))
        lane = f"{session_key}:{lane}"
        with self._lock:
            previous = self._previous.get(lane, 0)
            self._previous[lane] = tokens_without_proxy
        if usage.cache_read or usage.cache_write:
            read = min(previous, tokens_without_proxy)
            plain, write = 0, tokens_without_proxy - read
        else:
            plain, read, write = tokens_without_proxy, 0, 0
        return UsageEntry(
            requests=1,
            tokens_without_proxy=tokens_without_proxy,
            tokens_sent=usage.prompt_tokens,
            input_tokens=usage.input,
            cache_read_tokens=usage.cache_read,
            cache_write_tokens=usage.cache_write,
            output_tokens=usage.output,
            counterfactual_input_tokens=plain,
            counterfactual_cache_read_tokens=read,
            counterfactual_cache_write_tokens=write,
        )

    @staticmethod
    def summary_entry(usage: ProviderUsage) -> UsageEntry:
        """The ledger entry of one summary call."""
        return UsageEntry(summary_calls=1, summary_input_tokens=usage.input,
                          summary_cache_read_tokens=usage.cache_read,
                          summary_cache_write_tokens=usage.cache_write,
                          summary_output_tokens=usage.output)
