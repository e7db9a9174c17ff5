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
from .consistency import RedisConsistency
from .ledger import RedisLedger
from .records import RedisRecords
from .requests import RedisRequestLog
from .revocations import RedisLoginRevocations
from .state import RedisState
from .summaries import RedisSummaries

__all__ = ["PROBE_INTERVAL_S", "REDIS_MODES", "RedisMode", "RedisStateStore", "redacted_url"]


class RedisStateStore(RedisState, RedisSummaries, RedisRecords, RedisLedger, RedisRequestLog,
                      RedisConsistency, RedisLoginRevocations):
    """The :class:`~proxy.store.base.StoreBackend` backed by a Redis server; :meth:`open`
    PINGs it. ``url``, ``mode`` and ``sentinel_service`` are ``store.*``'s (docs/operations.md,
    "Redis"; redis-py options in the URL's query string win over ours); a bad one, or a bound
    out of range, raises :class:`ValueError`.

    Args:
        max_summaries: how many summaries the cache keeps before evicting the oldest.
        key_prefix: the prefix of every key this store reads or writes (no braces).
        timeout_s: connect and per-command socket timeout.
        max_requests_per_session, retention_days: the audit log's bounds (``audit.*``).
        audit_linger_s: how long the first audit entry of a batch waits for others.
    """
