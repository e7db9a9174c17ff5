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
    """The :class:`~proxy.store.base.StoreBackend` backed by a Redis server.

    Construction does no I/O (the connection pool connects lazily); :meth:`open` PINGs the
    server, which is what the service calls at startup so an unreachable server fails before
    anything is served.

    Args:
        url: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://…`` (TLS) or
            ``unix:///path/to/socket[?db=N]``; redis-py options in the query string (e.g.
            ``?socket_timeout=2``) win over the defaults below. In ``cluster`` mode, any
            node of the cluster (``redis://`` or ``rediss://``, database 0); in
            ``sentinel`` mode, ``redis[s]://[[user]:password@]host[:port][,host[:port]...]
            [/db]``: the Sentinels (port 26379 unless named), with the primary's
            credentials and database.
        mode: ``standalone``, ``cluster`` or ``sentinel`` (see the module's docstring).
        sentinel_service: the name the Sentinels monitor the primary under (``sentinel``).
        max_summaries: how many summaries the cache keeps before evicting the oldest.
        key_prefix: the prefix of every key this store reads or writes (no braces).
        timeout_s: connect and per-command socket timeout.
        max_requests_per_session: how many request entries a session keeps in the audit log.
        retention_days: how long audit entries are kept.
        audit_linger_s: how long the first audit entry of a batch waits for others
            (:mod:`~proxy.store.audit_batches`).

    Raises:
        ValueError: a bound is out of range, the prefix is empty or holds a brace, the URL
            is not a Redis URL (of the mode), or sentinel mode lacks its service.
    """
