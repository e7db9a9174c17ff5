"""The shared store backend: Redis (one server, a Sentinel-managed primary, or a Cluster),
safe for any number of proxy processes.

Every key of a session shares one Cluster hash tag (:mod:`.keys`), so each Lua script touches
one slot and runs atomically: the state's compare-and-swap with its change record, the summary
cache's insert and eviction, a usage row's increments, a session's audit writes. The global
indexes live in other slots and follow by separate commands (readers skip an entry whose row
is gone). After a connection failure the store fails fast while a probe PINGs every
:data:`PROBE_INTERVAL_S`; a state that does not decode raises ``CorruptStateError``.

One mixin per part of ``StoreBackend`` over :class:`~.connection.RedisConnection` (:mod:`.state`,
:mod:`.summaries`, :mod:`.records`, :mod:`.ledger`, :mod:`.requests`, :mod:`.consistency`),
composed in :class:`RedisStateStore`; scripts in ``lua/*.lua``. ``proxy.store`` imports this
(and redis-py) only when named. For operators: docs/operations.md, "Redis".
"""

from __future__ import annotations

from .client import REDIS_MODES, RedisMode, redacted_url
from .connection import PROBE_INTERVAL_S
from .store import RedisStateStore

__all__ = ["PROBE_INTERVAL_S", "REDIS_MODES", "RedisMode", "RedisStateStore", "redacted_url"]
