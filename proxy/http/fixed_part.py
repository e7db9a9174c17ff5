"""The fixed part of a request (``system``, ``tools``, the durable block): counted toward the
thresholds but no layer can compact it. From half the soft threshold, ``fixed_part_large``
says so once per session and model.
"""

from __future__ import annotations

from typing import Final

import structlog
from cachetools import LRUCache

__all__ = ["NEAR_RATIO", "FixedPartWarnings"]

_log = structlog.get_logger("proxy.http.fixed_part")

#: The share of the soft threshold from which the fixed part is called near it.
NEAR_RATIO: Final = 0.5
#: Sessions (and models) remembered as already warned about.
_REMEMBERED: Final = 10_000


class FixedPartWarnings:
    """Warns once per (tenant, session, model), in a bounded memory, that the fixed part is
    near or over a threshold."""

    def __init__(self) -> None:
        self._warned: LRUCache[tuple[str, str, str], bool] = LRUCache(_REMEMBERED)

    def check(self, key: tuple[str, str, str], fixed: int, soft: int, hard: int) -> None:
        if fixed < NEAR_RATIO * soft or key in self._warned:
            return
        self._warned[key] = True
        over = "hard limit" if fixed >= hard else "soft threshold" if fixed >= soft else None
        _log.warning(
            "fixed_part_large", fixed_tokens=fixed, soft_threshold=soft, hard_limit=hard,
            model=key[2],
            detail=(f"system + tools are {fixed:,} tokens, "
                    + (f"over the {over}" if over else f"{fixed / soft:.0%} of soft {soft:,}")
                    + ": raise compaction.soft_threshold_tokens / hard_limit_tokens"))
