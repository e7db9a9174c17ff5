"""Whether the provider could be reached, as ``/healthz`` tells it (docs/operations.md).

A 502 marks it unreachable (one ``upstream_unreachable`` warning), its next answer reachable
again; ``/healthz`` stays 200 meanwhile: every replica shares the provider.
"""

from __future__ import annotations

from datetime import UTC, datetime

import structlog

__all__ = ["UpstreamHealth"]

_log = structlog.get_logger("proxy.http.upstream_health")


class UpstreamHealth:
    """Since when the provider has been unreachable (``None``: it answered last)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.unreachable_since: datetime | None = None

    def unreachable(self, error_class: str) -> None:
        if self.unreachable_since is None:
            self.unreachable_since = datetime.now(UTC)
            _log.warning("upstream_unreachable", upstream=self.url, error_class=error_class)

    def answered(self) -> None:
        if self.unreachable_since is not None:
            self.unreachable_since = None
            _log.info("upstream_reachable", upstream=self.url)

    def status(self) -> str | None:
        """``unreachable since <ISO time>``, or ``None`` while it answers."""
        since = self.unreachable_since
        if since is None:
            return None
        return f"unreachable since {since.isoformat(timespec='seconds').replace('+00:00', 'Z')}"
