"""The Redis store: every part of :class:`~proxy.store.base.StoreBackend`, each from its
module, over one connection (:mod:`.connection`)."""

from __future__ import annotations

from .consistency import RedisConsistency
from .ledger import RedisLedger
from .records import RedisRecords
from .requests import RedisRequestLog
from .revocations import RedisLoginRevocations
from .state import RedisState
from .summaries import RedisSummaries

__all__ = ["RedisStateStore"]


class RedisStateStore(RedisState, RedisSummaries, RedisRecords, RedisLedger, RedisRequestLog,
                      RedisConsistency, RedisLoginRevocations):
    """The :class:`~proxy.store.base.StoreBackend` backed by a Redis server; :meth:`open`
    PINGs it. ``url``, ``mode`` and ``sentinel_service`` are ``store.*``'s
    (docs/operations.md, "Redis"); redis-py options in the URL's query string win over ours.

    Args:
        max_summaries: how many summaries the cache keeps before evicting the oldest.
        key_prefix: the prefix of every key this store reads or writes (no braces).
        timeout_s: connect and per-command socket timeout.
        max_requests_per_session, retention_days: the audit log's bounds (``audit.*``).
        audit_linger_s: how long the first audit entry of a batch waits for others.

    Raises:
        ValueError: a bound out of range, a bad prefix, URL or mode, or no sentinel service.
    """
