"""The shared store backend: Redis (one server, a Sentinel-managed primary, or a Cluster),
safe for any number of proxy processes.

Every key of a session shares one hash tag (:mod:`.keys`), so each Lua script (``lua/*.lua``)
touches one slot and runs atomically; the global indexes follow by separate commands. One mixin
per part of ``StoreBackend`` over :class:`~.connection.RedisConnection`, composed in
:class:`RedisStateStore`; ``proxy.store`` imports it only when named. docs/operations.md, "Redis".
"""

from __future__ import annotations

from .client import REDIS_MODES, RedisMode, redacted_url
from .connection import PROBE_INTERVAL_S
from .store import RedisStateStore

__all__ = ["PROBE_INTERVAL_S", "REDIS_MODES", "RedisMode", "RedisStateStore", "redacted_url"]
