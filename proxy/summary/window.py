"""What a refused summary call teaches: the model's window, and the prompt budget it leaves.

``prompt is too long: N tokens > M maximum`` gives the window M and the provider's count N of
a prompt the proxy counted: :class:`SummaryWindows` keeps per model the budget in counted
tokens (M less the margin and ``max_tokens``, divided by the provider's tokens per counted one).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Final

from proxy.config import SummaryConfig
from proxy.config._sections import SUMMARY_WINDOW_SHARE

__all__ = ["Refusal", "SummaryWindows", "refusal_of"]

_PROMPT_TOO_LONG: Final = re.compile(r"prompt is too long: (\d+) tokens > (\d+) maximum")


@dataclass(frozen=True)
class Refusal:
    """``prompt is too long: N tokens > M maximum``: N (``tokens``), M (``maximum``)."""

    tokens: int
    maximum: int


def refusal_of(exc: BaseException) -> Refusal | None:
    """The refusal an SDK error reports, if it is one."""
    found = _PROMPT_TOO_LONG.search(str(exc))
    return None if found is None else Refusal(*map(int, found.groups()))


class SummaryWindows:
    """Learnt prompt budgets per summary model (counted tokens), at most the configured one;
    the smallest one heard wins."""

    def __init__(self, config: SummaryConfig) -> None:
        self._config = config
        self._budgets: dict[str, int] = {}
        self._lock = threading.Lock()

    def budget(self, model: str) -> int:
        """The counted tokens one call's prompt may have for ``model``."""
        return min(self._config.prompt_budget, self._budgets.get(model, self._config.prompt_budget))

    def learn(self, model: str, refusal: Refusal, counted: int) -> int:
        """Learn from a call whose prompt was ``counted`` tokens by the proxy's count;
        returns the new budget (0: not even an answer fits)."""
        ratio = max(1.0, refusal.tokens / max(1, counted))
        provider_budget = int(refusal.maximum * SUMMARY_WINDOW_SHARE) - self._config.max_tokens
        budget = max(0, int(provider_budget / ratio))
        with self._lock:
            self._budgets[model] = min(budget, self._budgets.get(model, budget))
            return self._budgets[model]
