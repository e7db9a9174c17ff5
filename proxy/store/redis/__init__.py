"""The shared store backend: Redis (one server, a Sentinel-managed primary, or a Cluster),
safe for any number of proxy processes.

Theory of operation
-------------------
*Layout.* Every key starts with ``key_prefix`` (default ``compact-proxy:``) and a Redis
Cluster hash tag, so every key of one session is in one hash slot: :mod:`.keys` lists them.

*What is atomic.* Redis runs a Lua script atomically: no other client's command runs between
its first and its last step. Each script here touches the keys of one slot only (a cluster
refuses anything else):

- the state's compare-and-swap: the write script reads the current version, compares it
  with the caller's and writes the new hash, so of several writers racing from the same
  version (in this process or another) exactly one wins; the others get the new version
  back and raise :class:`~proxy.store.base.VersionConflict`; the delete likewise. The
  change the admin API or the console records is written (and its session's changes
  trimmed) by the same script (:mod:`.state`);
- the summary cache's insert-if-absent and eviction of the oldest beyond the bound (its
  three keys share the ``{summary}`` tag);
- a usage row's ``HINCRBY`` of every counter and its ``last_seen``;
- a session's audit entry with its totals and the trim of its entries (the oldest beyond the
  bound, and those older than the retention, each subtracted from the totals as it goes);
  a session's state change with the trim of its changes.

The global indexes (``usage:rows``, ``audit:sessions``, ``audit:blocked``,
``audit:changed``) live in another slot, so they are updated by separate commands right
after (a usage row's index entry right *before* its row): not atomically with the session's
keys. A process dying in between leaves an index entry whose row or session is gone (the
readers skip it; ``trim`` removes such sessions) or, for ``audit:blocked``, a refused entry
trimmed by count that stays listed until it ages out of the retention. Index scores only
move forward (``ZADD GT``), and a session left without entries is re-indexed if a racing
write gave it one, so concurrent writers never drop a live session from an index.
Scripts are sent once and then called by their SHA (``EVALSHA``; redis-py reloads them if the
server forgot them).

*Deployments* (``mode``): ``standalone``, one server (or a primary with replicas) at
``url``; ``cluster``, a Redis Cluster reached through any node at ``url``
(``redis.asyncio.cluster.RedisCluster``, which follows ``MOVED``/``ASK`` and failovers);
``sentinel``, the primary of ``sentinel_service`` as the Sentinels at ``url`` name it
(``redis://[[user]:password@]host:port[,host:port...][/db]``; the credentials are the
primary's, the Sentinels themselves are asked without).

*Outages.* A connection refused or reset, a timeout, a server loading its data, a failover
in progress, a cluster that is down or a Sentinel that names no primary is
:class:`~proxy.store.base.StoreUnavailable`. After one, the store fails fast (no
command is sent) while a probe PINGs every :data:`PROBE_INTERVAL_S` seconds; the first
answer opens it again. redis-py drops a broken connection and reconnects on the next
command, so nothing broken stays cached: the store recovers by itself. Commands are retried
once on a connection error (a pooled connection the server closed while it restarted), never
on a timeout (a script may have run). :meth:`RedisStateStore.available` is what ``/healthz``
asks.

*Durability* is whatever the server is configured for (RDB snapshots, AOF). The summaries and
records are caches; a lost admin write shows up as an older version, so the admin's next
``If-Match`` gets a clean 409 rather than a silent overwrite.

*Never garbage.* A state hash that does not decode (missing field, bad version, bad JSON, a
state that does not validate, a key of another type) raises
:class:`~proxy.store.base.CorruptStateError`. Every other Redis failure is a
:class:`~proxy.store.base.StoreError` whose message names the server without its password.

*Data written before this layout* (keys ``<prefix>state:<session>`` and so on, without
braces) is not read: :func:`proxy.sources.migrate.migrate_redis_layout` (``compact-proxy
migrate-redis-keys``) moves the durable states (what the admin API pinned) to their new keys;
the summaries, records, usage rows and audit log of the old layout are caches and reports,
and start afresh.

One module per part of :class:`~proxy.store.base.StoreBackend`, each a mixin over the
shared :class:`~.connection.RedisConnection` (:mod:`.state`, :mod:`.summaries`,
:mod:`.records`, :mod:`.ledger`, :mod:`.requests`, :mod:`.consistency`), composed in
:class:`RedisStateStore`; the scripts are ``lua/*.lua`` (:mod:`.scripts`).
``proxy.store`` re-exports :class:`RedisStateStore` on first use: importing
``proxy.store`` does not import redis-py; naming ``proxy.store.RedisStateStore`` does.
"""

from __future__ import annotations

from .client import REDIS_MODES, RedisMode, redacted_url
from .connection import PROBE_INTERVAL_S
from .store import RedisStateStore

__all__ = ["PROBE_INTERVAL_S", "REDIS_MODES", "RedisMode", "RedisStateStore", "redacted_url"]
