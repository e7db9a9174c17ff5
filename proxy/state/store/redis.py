"""The shared store backend: Redis (one server, a Sentinel-managed primary, or a Cluster),
safe for any number of proxy processes.

Theory of operation
-------------------
*Layout.* Every key starts with ``key_prefix`` (default ``compact-proxy:``), so several
deployments can share one database, followed by a Redis Cluster *hash tag* in braces: Redis
(and a cluster's client) hashes only the text between the first ``{`` and the next ``}``,
so every key of one session lives in the same hash slot, on the same cluster node:

- ``<prefix>{<session key>}:state``: a hash ``{version, state, updated_at}``; ``state`` is the
  canonical JSON of ``DurableContextState.to_dict()``, ``updated_at`` an ISO timestamp (UTC);
  ``<prefix>{<session key>}:tombstone``: the last version of a deleted state, which a state
  created again continues after (:mod:`._redis_state`: versions are never reused);
- ``<prefix>{<session key>}:record``: a hash ``kind -> bytes``, and
  ``<prefix>{<session key>}:record-versions``: ``kind -> version`` of the versioned ones;
- ``<prefix>{<session key>}:usage:<"model">``: a hash of one usage row, each counter of
  :class:`~proxy.state.usage.UsageEntry` under its field name plus ``last_seen`` (ISO, UTC);
  the model is a JSON string;
- ``<prefix>{<session>}:audit:requests``, a sorted set of the session's request entries
  (their JSON) scored by arrival time (Unix seconds); ``<prefix>{<session>}:audit:totals``, a
  hash of the session's totals over those entries (``requests``, ``tokens_before``,
  ``tokens_after``, ``blocked``, ``last_seen`` as ISO text and ``last_score``, the same time
  as a score); ``<prefix>{<session>}:audit:changes``, a sorted set of its state changes by
  time. The audit log's ``<session>`` is the session key of ``(tenant, session id)`` (the
  session id for tenant ``none``, else ``<tenant>/<session id>``: the state's own key);
- ``<prefix>{<session key>}:record-versions``: a hash ``kind -> version`` of the session's
  versioned records (:meth:`RedisStateStore.put_versioned_record` bumps it with the record,
  :meth:`RedisStateStore.session_versions` reads it with the state's version);
- ``<prefix>{<name>}:lock``: a lock (:meth:`RedisStateStore.lock_key`), taken with
  ``SET NX PX`` and a token, renewed and released only with that token (one script each).

What belongs to no session has a tag of its own, so each group is in one slot:

- ``<prefix>{summary}:summary:text``: a hash ``key -> summary text``;
  ``<prefix>{summary}:summary:order``: a sorted set of the same keys scored by insertion
  sequence, and ``<prefix>{summary}:summary:seq``: the counter handing those numbers out;
- ``<prefix>{usage}:usage:rows``: the set of every usage row as ``["session key","model"]``,
  which ``usage_rows`` lists;
- ``<prefix>{audit}:audit:sessions``: the sessions (``["tenant","session id"]``) scored by
  ``last_seen``; ``<prefix>{audit}:audit:blocked``: every refused entry (the same JSON) by
  time; ``<prefix>{audit}:audit:changed``: the sessions that have state changes, scored by
  their newest.

No two keys collide, whatever a session key holds: a key ends in ``}:`` and one of a fixed
set of suffixes (none the end of another), or in ``}:usage:`` and a JSON string (whose inner
quotes are escaped, so it cannot hold ``}:usage:"``). A session key holding ``}`` only makes
Redis hash a shorter tag, the same one for every key of that session. The prefix may not
hold a brace (it would become the tag of every key).

*What is atomic.* Redis runs a Lua script atomically: no other client's command runs between
its first and its last step. Each script here touches the keys of one slot only (a cluster
refuses anything else):

- the state's compare-and-swap: the write script reads the current version, compares it
  with the caller's and writes the new hash, so of several writers racing from the same
  version (in this process or another) exactly one wins; the others get the new version
  back and raise :class:`~proxy.state.store.base.VersionConflict`; the delete likewise. The
  change the admin API or the console records is written (and its session's changes
  trimmed) by the same script (:mod:`._redis_state`);
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
:class:`~proxy.state.store.base.StoreUnavailable`. After one, the store fails fast (no
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
:class:`~proxy.state.store.base.CorruptStateError`. Every other Redis failure is a
:class:`~proxy.state.store.base.StoreError` whose message names the server without its password.

*Data written before this layout* (keys ``<prefix>state:<session>`` and so on, without
braces) is not read: :func:`proxy.state.migrate.migrate_redis_layout` (``compact-proxy
migrate-redis-keys``) moves the durable states (what the admin API pinned) to their new keys;
the summaries, records, usage rows and audit log of the old layout are caches and reports,
and start afresh.

Everything in ``__all__`` gets re-exported by ``proxy.state.store``, on first use: importing
``proxy.state.store`` does not import redis-py; naming ``proxy.state.store.RedisStateStore`` does.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from functools import partial
from typing import Any, Final, Literal, Self, cast, get_args
from urllib.parse import unquote, urlsplit, urlunsplit

import redis.asyncio as aioredis
import structlog
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import (
    ClusterDownError,
    NoScriptError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from compactor import DurableContextState
from proxy.state.audit_log import (
    DEFAULT_MAX_REQUESTS_PER_SESSION,
    DEFAULT_RETENTION_DAYS,
    SESSION_ORDERS,
    RequestEntry,
    SessionOrder,
    SessionSummary,
    StateChange,
)
from proxy.state.usage import UsageEntry, UsageRow

from ._redis_state import (
    DELETE_STATE_LUA,
    PUT_STATE_LUA,
    delete_change_args,
    put_change_args,
)
from ._rows import (
    audit_stamp,
    check_bounds,
    check_change,
    decode_change,
    decode_entry,
    decode_state,
    decode_usage_row,
    encode_audit,
    encode_state,
    retention_cutoff,
    usage_stamp,
    utc_now,
)
from .audit_batches import AUDIT_LINGER_S, AuditBatches
from .base import (
    CorruptStateError,
    RecordFetch,
    SessionVersions,
    StoredState,
    StoreError,
    StoreUnavailable,
    VersionConflict,
)
from .redis_lane import Lane
from .redis_revocations import RedisLoginRevocations

__all__ = ["PROBE_INTERVAL_S", "REDIS_MODES", "RedisMode", "RedisStateStore"]

#: How a store reaches Redis (``store.redis_mode``).
RedisMode = Literal["standalone", "cluster", "sentinel"]
REDIS_MODES: Final[tuple[str, ...]] = get_args(RedisMode)
#: While the server is unreachable, how often a probe PINGs it (seconds).
PROBE_INTERVAL_S: Final = 0.5
#: How long a probe's PING may take (seconds).
PROBE_TIMEOUT_S: Final = 1.0
#: How long :meth:`RedisStateStore.available` reuses its last PING (seconds).
HEALTH_TTL_S: Final = 1.0
#: The Sentinels' port when ``store.url`` names none.
SENTINEL_PORT: Final = 26379

# Everything redis-py raises: its cluster client's own errors are not RedisErrors.
_FAILURES: Final = (RedisError, RedisClusterException)
_Failure = RedisError | RedisClusterException
# The server cannot be reached, or cannot answer for now (a failover, a load, a primary
# turned replica, a cluster resharding or down): retrying later may succeed.
_OUTAGES: Final = (RedisConnectionError, RedisTimeoutError, ClusterDownError, TryAgainError,
                   ReadOnlyError)

# KEYS = text hash, order zset, sequence counter; ARGV = key, text, max entries.
# Content-addressed: a key already cached keeps its text and its age. Then everything but the
# newest ``max`` entries (by insertion sequence) is evicted.
_PUT_SUMMARY_LUA: Final = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then
    local seq = redis.call('INCR', KEYS[3])
    redis.call('ZADD', KEYS[2], seq, ARGV[1])
end
local excess = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[3])
if excess > 0 then
    -- One HDEL per key: unpack() of a long list would overflow Lua's stack.
    for _, old in ipairs(redis.call('ZRANGE', KEYS[2], 0, excess - 1)) do
        redis.call('HDEL', KEYS[1], old)
    end
    redis.call('ZREMRANGEBYRANK', KEYS[2], 0, excess - 1)
end
return 0
"""

# KEYS = the row's hash; ARGV = last_seen, then (counter, increment) pairs. last_seen only
# moves forward (fixed-width ISO text compares as the times do). The index is not here: it
# is in another slot (the caller adds the row to it first).
_ADD_USAGE_LUA: Final = """
for i = 2, #ARGV, 2 do
    redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
end
local seen = redis.call('HGET', KEYS[1], 'last_seen')
if not seen or seen < ARGV[1] then
    redis.call('HSET', KEYS[1], 'last_seen', ARGV[1])
end
return 0
"""


# The trim of one session's audit entries, shared by the add and trim scripts.
# KEYS = the session's entries zset, its totals hash; ARGV[1] = max entries, ARGV[2] = the
# retention cutoff score. Each entry dropped is subtracted from the totals; a session left
# without entries loses both keys. trim() returns {entries removed, 1 if the session is gone,
# the refused entries removed (for the caller to take out of the blocked index), the
# session's last_score ('' when gone)}.
_TRIM_FUNCTIONS_LUA: Final = """
local refused = {}
local function drop(members)
    for _, m in ipairs(members) do
        local e = cjson.decode(m)
        redis.call('HINCRBY', KEYS[2], 'requests', -1)
        if type(e.tokens_before) == 'number' then
            redis.call('HINCRBY', KEYS[2], 'tokens_before', -e.tokens_before)
        end
        if type(e.tokens_after) == 'number' then
            redis.call('HINCRBY', KEYS[2], 'tokens_after', -e.tokens_after)
        end
        if type(e.reason) == 'string' then
            redis.call('HINCRBY', KEYS[2], 'blocked', -1)
            refused[#refused + 1] = m
        end
        redis.call('ZREM', KEYS[1], m)
    end
    return #members
end
local function trim()
    local removed = drop(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[2]))
    local excess = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[1])
    if excess > 0 then
        removed = removed + drop(redis.call('ZRANGE', KEYS[1], 0, excess - 1))
    end
    if redis.call('ZCARD', KEYS[1]) == 0 then
        redis.call('DEL', KEYS[1], KEYS[2])
        return {removed, 1, refused, ''}
    end
    return {removed, 0, refused, redis.call('HGET', KEYS[2], 'last_score') or ''}
end
"""

_TRIM_SESSION_LUA: Final = _TRIM_FUNCTIONS_LUA + "return trim()\n"

# KEYS as the trim; ARGV as the trim, then for each entry of one session (a batch): its
# JSON, its score, its ISO time, tokens_before, tokens_after, blocked (0/1). A member already
# there is not counted again. The session's last_seen (ISO text, and last_score, the same
# time as a score) only moves forward. Returns the trim's reply (once, after every entry).
_ADD_REQUESTS_LUA: Final = _TRIM_FUNCTIONS_LUA + """
for at = 3, #ARGV, 6 do
    if redis.call('ZADD', KEYS[1], ARGV[at + 1], ARGV[at]) == 1 then
        redis.call('HINCRBY', KEYS[2], 'requests', 1)
        redis.call('HINCRBY', KEYS[2], 'tokens_before', ARGV[at + 3])
        redis.call('HINCRBY', KEYS[2], 'tokens_after', ARGV[at + 4])
        redis.call('HINCRBY', KEYS[2], 'blocked', ARGV[at + 5])
    end
    local seen = redis.call('HGET', KEYS[2], 'last_seen')
    if not seen or seen < ARGV[at + 2] then
        redis.call('HSET', KEYS[2], 'last_seen', ARGV[at + 2], 'last_score', ARGV[at + 1])
    end
end
return trim()
"""

# KEYS = the session's changes zset; ARGV = the change's JSON, its score, max entries, the
# retention cutoff score. Returns the newest change's score, or false when none is left.
_ADD_CHANGE_LUA: Final = """
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[4])
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(tonumber(ARGV[3]) + 1))
local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if #newest == 0 then return false end
return newest[2]
"""

# KEYS = the session's changes zset; ARGV[1] = the retention cutoff score. Returns {how many
# changes went, the newest one's score or ''}.
_TRIM_CHANGES_LUA: Final = """
local removed = redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[1])
local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if #newest == 0 then return {removed, ''} end
return {removed, newest[2]}
"""


def _as_bytes(value: bytes | str | None) -> bytes | None:
    # The client is built with decode_responses=False, so replies are bytes; the str branch
    # only satisfies redis-py's types (which allow both).
    return value.encode("utf-8") if isinstance(value, str) else value


def _as_text(value: bytes | str) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value


def _session_key(tenant: str, session_id: str) -> str:
    """The store key of a tenant's session, as :func:`proxy.http.tenants.scoped_key` makes it
    (the audit log's keys share the hash slot of the session's state)."""
    return session_id if tenant == "none" else f"{tenant}/{session_id}"


def _pair_member(first: str, second: str) -> str:
    """An index member (and key suffix) naming two strings: ``["first","second"]`` — a usage
    row's ``[session key, model]``, an audit session's ``[tenant, session id]``."""
    return json.dumps([first, second], ensure_ascii=False, separators=(",", ":"))


def _pair_of(member: bytes | str, where: str) -> tuple[str, str]:
    """The two strings back from a :func:`_pair_member` member of the index ``where``."""
    try:
        pair = json.loads(member)
    except ValueError:
        pair = None
    if (not isinstance(pair, list) or len(pair) != 2
            or not all(isinstance(part, str) for part in pair)):
        raise CorruptStateError(where, "an index member is not a pair of strings")
    return pair[0], pair[1]


def _listed(reply: object) -> list[bytes | str]:
    """A list reply of members (redis-py types every reply as a union of shapes)."""
    return list(cast("list[bytes | str]", reply))


def _score(when: datetime) -> str:
    """A time as a sorted-set score: Unix seconds, exact to the microsecond as text."""
    return repr(when.timestamp())


def _totals(member: str, raw: dict[Any, Any]) -> SessionSummary:
    """A session's totals hash as a :class:`SessionSummary`."""
    tenant, session_id = _pair_of(member, "<audit log>")
    fields = {_as_text(name): _as_text(value) for name, value in raw.items()}
    try:
        counts = {name: int(fields.get(name, "0")) for name in
                  ("requests", "tokens_before", "tokens_after", "blocked")}
        last_seen = datetime.fromisoformat(fields["last_seen"])
    except (KeyError, ValueError):
        raise CorruptStateError("<audit log>", f"the totals of session {session_id!r} "
                                "do not read back") from None
    return SessionSummary(session_id=session_id, tenant=tenant, last_seen=last_seen, **counts)


def redacted_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``, for error messages and logs."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "<unparseable redis url>"
    if password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def _sentinels(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """The Sentinels' addresses of a ``sentinel`` mode URL, and the primary's connection
    options (database, credentials, TLS) from it.

    Raises:
        ValueError: not ``redis://`` or ``rediss://``, no address, a bad port or database,
            or a query string.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        raise ValueError("sentinel mode needs a redis:// or rediss:// URL")
    if parts.query:
        raise ValueError("sentinel mode takes no options in the URL")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    addresses = []
    for address in hosts.split(","):
        if address.startswith("["):  # [IPv6]:port
            host, _, rest = address[1:].partition("]")
            port = rest.removeprefix(":")
        else:
            host, _, port = address.partition(":")
        if not host or (port and not port.isdigit()):
            raise ValueError(f"sentinel address {address!r} is not host[:port]")
        addresses.append((host, int(port) if port else SENTINEL_PORT))
    options: dict[str, Any] = {"ssl": parts.scheme == "rediss"}
    path = parts.path.strip("/")
    if path:
        if not path.isdigit():
            raise ValueError(f"database {path!r} is not a number")
        options["db"] = int(path)
    if userinfo:
        user, _, password = userinfo.partition(":")
        options["username"] = unquote(user) or None
        options["password"] = unquote(password) or None
    return addresses, options


def _client(url: str, mode: str, service: str | None,
            timeout_s: float) -> aioredis.Redis | RedisCluster:
    """The redis-py client of ``mode``: one connection pool, nothing connected yet.

    A command is retried once, at once, on a connection error (a pooled connection the
    server closed); never on a timeout, since a script may have run.
    """
    options: dict[str, Any] = {
        "socket_connect_timeout": timeout_s, "socket_timeout": timeout_s,
        "retry": Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
    }
    if mode == "cluster":
        if urlsplit(url).scheme not in ("redis", "rediss"):
            raise ValueError("cluster mode needs a redis:// or rediss:// URL")
        return RedisCluster.from_url(url, **options)
    if mode == "sentinel":
        if not service:
            raise ValueError("sentinel mode needs the service name of the primary")
        addresses, primary = _sentinels(url)
        sentinel_options = {"socket_connect_timeout": timeout_s, "socket_timeout": timeout_s}
        sentinel = Sentinel(addresses, sentinel_kwargs=sentinel_options,  # type: ignore[no-untyped-call,unused-ignore]
                            **options)
        return cast("aioredis.Redis", sentinel.master_for(service, redis_class=aioredis.Redis,
                                                          **primary))
    if mode != "standalone":
        raise ValueError(f"mode must be one of {', '.join(REDIS_MODES)}, got {mode!r}")
    return aioredis.Redis.from_url(url, **options)


class RedisStateStore(RedisLoginRevocations):
    """The :class:`~proxy.state.store.base.StoreBackend` backed by a Redis server.

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
            (:mod:`~proxy.state.store.audit_batches`).

    Raises:
        ValueError: a bound is out of range, the prefix is empty or holds a brace, the URL
            is not a Redis URL (of the mode), or sentinel mode lacks its service.
    """

    def __init__(self, url: str, *, mode: RedisMode = "standalone",
                 sentinel_service: str | None = None, max_summaries: int = 1000,
                 key_prefix: str = "compact-proxy:", timeout_s: float = 5.0,
                 max_requests_per_session: int = DEFAULT_MAX_REQUESTS_PER_SESSION,
                 retention_days: int = DEFAULT_RETENTION_DAYS,
                 audit_linger_s: float = AUDIT_LINGER_S) -> None:
        if max_summaries < 1:
            raise ValueError(f"max_summaries must be >= 1, got {max_summaries}")
        check_bounds(max_requests_per_session, retention_days)
        self.max_requests_per_session = max_requests_per_session
        self.retention_days = retention_days
        if not key_prefix:
            raise ValueError("key_prefix must not be empty")
        if "{" in key_prefix or "}" in key_prefix:
            raise ValueError("key_prefix must not hold { or } (the hash tags' braces)")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.url = redacted_url(url)
        self.max_summaries = max_summaries
        self.key_prefix = key_prefix
        self.mode = mode
        try:
            self._redis = _client(url, mode, sentinel_service, timeout_s)
        except ValueError as exc:
            # redis-py's messages name the scheme or option, never the URL itself.
            raise ValueError(f"invalid redis url {self.url}: {exc}") from None
        # The scripts every request runs go by a lane of the store's own (not in a cluster,
        # whose client routes each key to its node: see proxy.state.store.redis_lane).
        self._lane = (Lane(self._redis.connection_pool)
                      if isinstance(self._redis, aioredis.Redis) else None)
        self._put_state_script = self._redis.register_script(PUT_STATE_LUA)
        self._delete_state_script = self._redis.register_script(DELETE_STATE_LUA)
        self._put_summary_script = self._redis.register_script(_PUT_SUMMARY_LUA)
        self._add_usage_script = self._redis.register_script(_ADD_USAGE_LUA)
        self._add_requests_script = self._redis.register_script(_ADD_REQUESTS_LUA)
        self._trim_session_script = self._redis.register_script(_TRIM_SESSION_LUA)
        self._add_change_script = self._redis.register_script(_ADD_CHANGE_LUA)
        # The replica scripts (_replica_script), registered on first use, by their text.
        self._replica_scripts: dict[str, Any] = {}
        self._trim_changes_script = self._redis.register_script(_TRIM_CHANGES_LUA)
        self._summary_keys = [self._key("summary", "summary:text"),
                              self._key("summary", "summary:order"),
                              self._key("summary", "summary:seq")]
        self._closed = False
        # Audit entries waiting for their batch's write (used from the event loop only).
        self._batches = AuditBatches(self._write_requests, linger_s=audit_linger_s)
        # Why the server is unreachable (None: it is not known to be); while set, every
        # call fails fast and a probe PINGs until it answers.
        self._down: str | None = None
        self._probe: asyncio.Task[None] | None = None
        self._health: tuple[float, bool] | None = None  # (when, answered) of the last PING

    async def open(self) -> Self:
        """PING the server now; returns the store itself.

        Raises:
            StoreError: the server does not answer (or refuses the credentials); the store is
                closed.
        """
        try:
            self._check_open()
            await self._redis.ping()
        except _FAILURES as exc:
            await self.close()
            raise self._error("connect", exc) from None
        except BaseException:
            await self.close()
            raise
        return self

    async def available(self) -> bool:
        """Whether the server answers now: ``False`` while it is known to be unreachable,
        else a PING (at most :data:`PROBE_TIMEOUT_S`), whose answer is reused for
        :data:`HEALTH_TTL_S`. What ``/healthz`` asks; never raises."""
        if self._closed or self._down is not None:
            return False
        now = asyncio.get_running_loop().time()
        if self._health is not None and now - self._health[0] < HEALTH_TTL_S:
            return self._health[1]
        answered = await self._ping()
        self._health = (asyncio.get_running_loop().time(), answered)
        if not answered:
            self._mark_down(f"redis store {self.url}: no answer to PING")
        return answered

    @property
    def client(self) -> aioredis.Redis | RedisCluster:
        """The redis-py client, for maintenance (:mod:`proxy.state.migrate`); the request
        path never uses it directly."""
        return self._redis

    # -- the key layout (see the module's docstring) ----------------------------------------

    def _key(self, tag: str, suffix: str) -> str:
        """``<prefix>{<tag>}:<suffix>``: every key with the same tag is in one hash slot."""
        return f"{self.key_prefix}{{{tag}}}:{suffix}"

    def state_key(self, session_id: str) -> str:
        """The Redis key of the session's state hash."""
        return self._key(session_id, "state")

    def record_key(self, session_id: str) -> str:
        """The Redis key of the session's record hash."""
        return self._key(session_id, "record")

    def lock_key(self, name: str) -> str:
        """The Redis key of the lock ``name`` (in the slot of a session named ``name``)."""
        return self._key(name, "lock")

    def usage_key(self, session_key: str, model: str) -> str:
        """The Redis key of the usage row of ``(session_key, model)``."""
        return self._key(session_key, "usage:" + json.dumps(model, ensure_ascii=False))

    @property
    def usage_index_key(self) -> str:
        """The Redis key of the set indexing every usage row."""
        return self._key("usage", "usage:rows")

    @property
    def summary_keys(self) -> list[str]:
        """The summary cache's keys: its text hash, its age index, its sequence counter."""
        return list(self._summary_keys)

    def audit_keys(self, tenant: str, session_id: str) -> list[str]:
        """The keys of one session's audit log, as the scripts take them: its entries and its
        totals (in the slot of the session's state)."""
        tag = _session_key(tenant, session_id)
        return [self._key(tag, "audit:requests"), self._key(tag, "audit:totals")]

    def change_keys(self, tenant: str, session_id: str) -> list[str]:
        """The keys of one session's state changes: its changes (in the session's slot)."""
        return [self._key(_session_key(tenant, session_id), "audit:changes")]

    @property
    def audit_sessions_key(self) -> str:
        """The index of the audit log's sessions, by ``last_seen``."""
        return self._key("audit", "audit:sessions")

    @property
    def audit_blocked_key(self) -> str:
        """The index of every refused request entry, by time."""
        return self._key("audit", "audit:blocked")

    @property
    def audit_changed_key(self) -> str:
        """The index of the sessions with state changes, by their newest."""
        return self._key("audit", "audit:changed")

    # -- the async interface -------------------------------------------------------------

    async def get_state(self, session_id: str) -> StoredState | None:
        """Return the session's current state, or ``None`` when it has none."""
        self._check_open()
        try:
            values = await self._redis.hmget(
                self.state_key(session_id), ["version", "state", "updated_at"]
            )
        except ResponseError as exc:
            if str(exc).startswith("WRONGTYPE"):
                raise CorruptStateError(session_id, "the state key is not a hash") from None
            raise self._error("read state", exc) from exc
        except _FAILURES as exc:
            raise self._error("read state", exc) from exc
        version, state_json, updated_at = (_as_bytes(value) for value in values)
        if version is None and state_json is None and updated_at is None:
            return None
        return self._decode(session_id, version, state_json, updated_at)

    async def put_state(self, session_id: str, state: DurableContextState,
                        expected_version: int | None,
                        change: StateChange | None = None) -> StoredState:
        """Compare-and-swap write, with ``change`` in the same script; see
        :meth:`proxy.state.store.base.StateStore.put_state`."""
        if not isinstance(state, DurableContextState):
            raise TypeError(f"state must be a DurableContextState, got {type(state).__name__}")
        check_change(session_id, change, "put")
        self._check_open()
        state_json = encode_state(state)
        when = utc_now()
        expected = "" if expected_version is None else str(int(expected_version))
        args = put_change_args(change, *self._change_bounds(change))
        try:
            outcome, version, *newest = await self._put_state_script(
                keys=self._state_keys(session_id),
                args=[expected, state_json, when.isoformat(), *args])
        except _FAILURES as exc:
            raise self._write_error(session_id, "write state", exc) from exc
        self._check_outcome(session_id, outcome)
        if outcome == 0:
            raise VersionConflict(session_id, expected_version, None if version < 0 else version)
        await self._index_change(session_id, change, newest)
        return StoredState(session_id=session_id, version=int(version), state=state,
                           updated_at=when)

    async def delete_state(self, session_id: str, expected_version: int | None = None,
                           change: StateChange | None = None) -> bool:
        """Delete the state, with ``change`` in the same script; see
        :meth:`proxy.state.store.base.StateStore.delete_state`."""
        check_change(session_id, change, "delete")
        self._check_open()
        expected = "" if expected_version is None else str(int(expected_version))
        args = delete_change_args(change, *self._change_bounds(change))
        try:
            outcome, current, *newest = await self._delete_state_script(
                keys=self._state_keys(session_id), args=[expected, *args])
        except _FAILURES as exc:
            raise self._write_error(session_id, "delete state", exc) from exc
        self._check_outcome(session_id, outcome)
        if outcome == 2:
            raise VersionConflict(session_id, expected_version, int(current))
        if outcome == 1:
            await self._index_change(session_id, change, newest)
        return bool(outcome == 1)

    def _state_keys(self, session_id: str) -> list[str]:
        """The keys a state write touches: the state, its tombstone, its changes (one slot)."""
        return [self.state_key(session_id), self._key(session_id, "tombstone"),
                self._key(session_id, "audit:changes")]

    def _change_bounds(self, change: StateChange | None) -> tuple[str, int, str]:
        """A change's score, how many a session keeps and the oldest score one may have."""
        cutoff = retention_cutoff(utc_now(), self.retention_days)
        return ("" if change is None else _score(change.at), self.max_requests_per_session,
                _score(cutoff))

    @staticmethod
    def _check_outcome(session_id: str, outcome: int) -> None:
        if outcome == -1:
            raise CorruptStateError(session_id, "stored version is not an integer >= 1")
        if outcome == -2:
            raise CorruptStateError("<audit log>", "cannot record the state change: a key "
                                    "does not hold what the audit log keeps there")

    async def _index_change(self, session_id: str, change: StateChange | None,
                            newest: list[Any]) -> None:
        """List the session in the index of changed sessions, after a write recorded
        ``change``. The write and its record are kept already: a failure here is logged,
        and the next change or ``trim`` lists it again."""
        if change is None or not newest or not newest[0]:
            return
        key = self._key(session_id, "audit:changes")
        try:
            await self._index(self.audit_changed_key,
                              _pair_member(change.tenant, change.session_id),
                              _as_text(newest[0]), partial(self._newest_change, key))
        except _FAILURES as exc:
            structlog.get_logger().warning("state_change_not_indexed",
                                           error_class=type(exc).__name__)

    async def get_summary(self, key: str) -> str | None:
        """Return the cached summary stored under ``key``, or ``None``."""
        self._check_open()
        try:
            raw = await self._redis.hget(self._summary_keys[0], key)
        except _FAILURES as exc:
            raise self._error("read summary", exc) from exc
        text = _as_bytes(raw)
        if text is None:
            return None
        try:
            return text.decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptStateError(f"<summary {key}>", "summary text is not UTF-8") from None

    async def put_summary(self, key: str, text: str) -> None:
        """Cache ``text`` under ``key``, evicting the oldest entries beyond ``max_summaries``."""
        self._check_open()
        try:
            await self._put_summary_script(keys=self._summary_keys,
                                           args=[key, text, self.max_summaries])
        except _FAILURES as exc:
            raise self._error("write summary", exc) from exc

    async def get_record(self, session_id: str, kind: str) -> bytes | None:
        """Return the opaque compaction record ``kind`` of the session, or ``None``."""
        self._check_open()
        try:
            raw = await self._redis.hget(self.record_key(session_id), kind)
        except _FAILURES as exc:
            raise self._error("read record", exc) from exc
        return _as_bytes(raw)

    async def put_record(self, session_id: str, kind: str, data: bytes) -> None:
        """Store (replace) the opaque compaction record ``kind`` of the session."""
        self._check_open()
        try:
            await self._redis.hset(self.record_key(session_id), kind, bytes(data))
        except _FAILURES as exc:
            raise self._error("write record", exc) from exc

    async def add_usage(self, session_key: str, model: str, entry: UsageEntry) -> None:
        """Add ``entry`` to the row of ``(session_key, model)``; see
        :meth:`proxy.state.store.base.UsageLedger.add_usage`."""
        if not isinstance(entry, UsageEntry):
            raise TypeError(f"entry must be a UsageEntry, got {type(entry).__name__}")
        self._check_open()
        args: list[str | int] = [usage_stamp()]
        for name in UsageEntry.field_names():
            args += [name, getattr(entry, name)]
        try:
            # The index first: a row it lists but that is not written is left out by
            # usage_rows, while a row written but not listed would be lost to it.
            await self._redis.sadd(self.usage_index_key, _pair_member(session_key, model))
            await self._add_usage_script(keys=[self.usage_key(session_key, model)], args=args)
        except _FAILURES as exc:
            if isinstance(exc, ResponseError) and "WRONGTYPE" in str(exc):
                raise CorruptStateError(session_key, "the usage key is not a hash") from None
            if isinstance(exc, ResponseError) and "not an integer" in str(exc):
                raise CorruptStateError(session_key, "a usage counter is not an integer"
                                        ) from None
            raise self._error("add usage", exc) from exc

    async def usage_rows(self) -> list[UsageRow]:
        """Every usage row, ordered by session key, then model.

        A row in the index whose hash is gone (deleted by hand) is left out.
        """
        self._check_open()
        try:
            members = await self._redis.smembers(self.usage_index_key)
            pairs = sorted(_pair_of(member, "<usage index>") for member in members)
            async with self._redis.pipeline(transaction=False) as pipe:
                for session_key, model in pairs:
                    pipe.hgetall(self.usage_key(session_key, model))
                hashes = await pipe.execute()
        except _FAILURES as exc:
            raise self._error("read usage", exc) from exc
        rows = []
        for (session_key, model), raw in zip(pairs, hashes, strict=True):
            if not raw:
                continue
            counters = {_as_text(name): value for name, value in raw.items()}
            rows.append(decode_usage_row(session_key, model, counters,
                                         counters.get("last_seen")))
        return rows

    # -- the audit log (proxy.state.audit_log.RequestLog) ---------------------------------

    def add_request(self, entry: RequestEntry) -> asyncio.Future[None]:
        """Keep ``entry``, then trim its session (bound and retention).

        Entries added within ``audit_linger_s`` (a second) of each other, or while a write is
        under way, go together (:class:`~proxy.state.store.audit_batches.AuditBatches`): one
        script per session of the batch, then its places in the global indexes (each round
        trip costs the proxy about 0.2 ms of CPU; three per entry cost more than the rest of
        its request's bookkeeping). The indexes follow what each session's trim dropped;
        other sessions' old entries wait for :meth:`trim`, as the SQLite store's do. Returns
        the batch's future, done once it is written (or failed with its error).

        Raises:
            TypeError: ``entry`` is not a :class:`RequestEntry`.
            StoreError: the store is closed; :class:`StoreUnavailable` when its server is
                known to be unreachable.
        """
        if not isinstance(entry, RequestEntry):
            raise TypeError(f"entry must be a RequestEntry, got {type(entry).__name__}")
        self._check_open()
        return self._batches.add(entry)

    async def _write_requests(self, batch: list[RequestEntry]) -> None:
        """One batch: each session's entries by one script, then that session's places in
        the global indexes (a failure leaves the sessions before it whole)."""
        sessions: dict[tuple[str, str], list[RequestEntry]] = {}
        for entry in batch:
            sessions.setdefault((entry.tenant, entry.session_id), []).append(entry)
        try:
            for (tenant, session_id), entries in sessions.items():
                member, maximum, cutoff = self._trim_args(tenant, session_id)
                keys = self.audit_keys(tenant, session_id)
                args: list[Any] = [maximum, cutoff]
                texts = [encode_audit(entry) for entry in entries]
                for entry, text in zip(entries, texts, strict=True):
                    args += [text, _score(entry.at), audit_stamp(entry.at),
                             entry.tokens_before or 0, entry.tokens_after or 0,
                             int(entry.blocked)]
                reply = await self._add_requests_script(keys=keys, args=args)
                refused = {_as_text(m) for m in reply[2]}
                blocked = {text: _score(entry.at)
                           for entry, text in zip(entries, texts, strict=True)
                           if entry.blocked and text not in refused}
                if blocked:  # (refusals are few: their index is written session by session)
                    await self._redis.zadd(self.audit_blocked_key, blocked)
                await self._after_trim(member, keys[1], reply)
        except _FAILURES as exc:
            raise self._audit_error("add audit entries", exc) from exc

    async def flush(self) -> None:
        """Write the entries :meth:`add_request` still holds back, now."""
        await self._batches.flush()

    async def add_state_change(self, change: StateChange) -> None:
        """Keep ``change``, then trim the session's changes by count and age."""
        if not isinstance(change, StateChange):
            raise TypeError(f"change must be a StateChange, got {type(change).__name__}")
        self._check_open()
        member, _, cutoff = self._trim_args(change.tenant, change.session_id)
        key = self.change_keys(change.tenant, change.session_id)[0]
        try:
            newest = await self._add_change_script(
                keys=[key], args=[encode_audit(change), _score(change.at),
                                  self.max_requests_per_session, cutoff])
            await self._index(self.audit_changed_key, member,
                              None if newest is None else _as_text(newest),
                              partial(self._newest_change, key))
        except _FAILURES as exc:
            raise self._audit_error("add state change", exc) from exc

    async def sessions(self, *, offset: int = 0, limit: int = 50, contains: str | None = None,
                       order: SessionOrder = "last_seen",
                       tenant: str | None = None) -> tuple[list[SessionSummary], int]:
        """One page of sessions and how many match; see
        :meth:`proxy.state.audit_log.RequestLog.sessions`."""
        _check_page(offset, limit)
        if order not in SESSION_ORDERS:
            raise ValueError(f"order must be one of {', '.join(SESSION_ORDERS)}, got {order!r}")
        self._check_open()
        await self._batches.flush()  # this process's entries are read too
        index = self.audit_sessions_key
        try:
            if order == "last_seen" and not contains and tenant is None:
                # The index is in the order asked for: read just the page.
                total = int(await self._redis.zcard(index))
                page = [_as_text(m) for m in _listed(
                    await self._redis.zrevrange(index, offset, offset + limit - 1))]
                summaries = await self._summaries(page)
            else:
                members = [_as_text(m) for m in _listed(await self._redis.zrevrange(index, 0, -1))]
                if contains or tenant is not None:
                    needle = (contains or "").lower()
                    members = [m for m in members
                               if needle in _pair_of(m, "<audit log>")[1].lower()
                               and tenant in (None, _pair_of(m, "<audit log>")[0])]
                total = len(members)
                if order == "last_seen":
                    summaries = await self._summaries(members[offset:offset + limit])
                else:
                    everything = await self._summaries(members)
                    # Stable: equal counts keep the index's newest-first order.
                    everything.sort(key=lambda summary: -summary.blocked)
                    summaries = everything[offset:offset + limit]
        except _FAILURES as exc:
            raise self._audit_error("read audit sessions", exc) from exc
        return summaries, total

    async def session_requests(self, tenant: str, session_id: str, *, offset: int = 0,
                               limit: int = 100) -> tuple[list[RequestEntry], int]:
        """One page of a session's requests, newest first, and how many it has."""
        _check_page(offset, limit)
        self._check_open()
        await self._batches.flush()  # this process's entries are read too
        key = self.audit_keys(tenant, session_id)[0]
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.zcard(key)
                pipe.zrevrange(key, offset, offset + limit - 1)
                total, members = await pipe.execute()
        except _FAILURES as exc:
            raise self._audit_error("read audit entries", exc) from exc
        return [decode_entry(member) for member in members], int(total)

    async def state_changes(self, tenant: str, session_id: str, *,
                            limit: int = 100) -> list[StateChange]:
        """A session's state changes, newest first."""
        _check_page(0, limit)
        self._check_open()
        try:
            members = await self._redis.zrevrange(self.change_keys(tenant, session_id)[0],
                                                  0, limit - 1)
        except _FAILURES as exc:
            raise self._audit_error("read state changes", exc) from exc
        return [decode_change(member) for member in _listed(members)]

    async def blocked_since(self, since: datetime, *, limit: int = 1000) -> list[RequestEntry]:
        """Refused requests that arrived at or after ``since``, oldest first."""
        _check_page(0, limit)
        self._check_open()
        await self._batches.flush()  # this process's entries are read too
        try:
            members = await self._redis.zrangebyscore(self.audit_blocked_key,
                                                      _score(since), "+inf", start=0, num=limit)
        except _FAILURES as exc:
            raise self._audit_error("read blocked requests", exc) from exc
        return [decode_entry(member) for member in _listed(members)]

    async def trim(self, now: datetime) -> int:
        """Drop the audit entries older than the retention at ``now``, session by session;
        returns how many went."""
        self._check_open()
        cutoff = _score(retention_cutoff(now, self.retention_days))
        removed = 0
        try:
            sessions = _listed(await self._redis.zrange(self.audit_sessions_key, 0, -1))
            for tenant, session_id in [_pair_of(m, "<audit log>") for m in sessions]:
                member, maximum, _ = self._trim_args(tenant, session_id)
                keys = self.audit_keys(tenant, session_id)
                reply = await self._trim_session_script(keys=keys, args=[maximum, cutoff])
                removed += int(reply[0])
                await self._after_trim(member, keys[1], reply)
            await self._redis.zremrangebyscore(self.audit_blocked_key, "-inf", f"({cutoff}")
            changed = _listed(await self._redis.zrange(self.audit_changed_key, 0, -1))
            for tenant, session_id in [_pair_of(m, "<audit log>") for m in changed]:
                key = self.change_keys(tenant, session_id)[0]
                gone, newest = await self._trim_changes_script(keys=[key], args=[cutoff])
                removed += int(gone)
                await self._index(self.audit_changed_key, _pair_member(tenant, session_id),
                                  _as_text(newest) or None, partial(self._newest_change, key))
        except _FAILURES as exc:
            raise self._audit_error("trim the audit log", exc) from exc
        return removed

    async def _summaries(self, members: list[str]) -> list[SessionSummary]:
        """The totals of each session, in the order given; a session whose totals are gone
        (a writer stopped between its session's keys and the index) is left out."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for member in members:
                pipe.hgetall(self.audit_keys(*_pair_of(member, "<audit log>"))[1])
            hashes = await pipe.execute()
        return [_totals(member, raw) for member, raw in zip(members, hashes, strict=True) if raw]

    async def _after_trim(self, member: str, totals_key: str, reply: list[Any]) -> None:
        """The global indexes after a session's add or trim script (its ``reply``): the
        refused entries it dropped leave the blocked index, and the session's entry in the
        sessions index follows its totals."""
        refused = [_as_text(m) for m in reply[2]]
        if refused:
            await self._redis.zrem(self.audit_blocked_key, *refused)
        score = None if int(reply[1]) else _as_text(reply[3]) or None

        async def last_score() -> str | None:
            value = await self._redis.hget(totals_key, "last_score")
            return None if value is None else _as_text(value)

        await self._index(self.audit_sessions_key, member, score, last_score)

    async def _newest_change(self, key: str) -> str | None:
        """The score of the newest change in the changes zset ``key``, or ``None``."""
        newest = await self._redis.zrange(key, -1, -1, withscores=True)
        return repr(float(newest[0][1])) if newest else None

    async def _index(self, index: str, member: str, score: str | None,
                     current: Callable[[], Awaitable[str | None]]) -> None:
        """Bring ``member``'s place in ``index`` (a global sorted set) in line with its
        session's keys just written: at ``score`` (only ever raised), or out when ``score``
        is ``None`` (the session has nothing left). A write of the same session that raced
        this one may have indexed it just before the ZREM, so ``current`` (the session's
        score now, ``None``: nothing) is asked again after it."""
        if score is None:
            await self._redis.zrem(index, member)
            score = await current()
            if score is None:
                return
        await self._redis.zadd(index, {member: score}, gt=True)

    def _trim_args(self, tenant: str, session_id: str) -> list[Any]:
        """The trim script's ARGV for a session: its member, the bound, the cutoff score."""
        cutoff = retention_cutoff(utc_now(), self.retention_days)
        return [_pair_member(tenant, session_id), self.max_requests_per_session,
                _score(cutoff)]

    async def close(self) -> None:
        """Close the connection pool; idempotent. Later calls raise :class:`StoreError`."""
        if self._closed:
            return
        try:
            await self._batches.flush()  # the audit entries gathered for a batch: written now
        finally:
            self._closed = True
            if self._probe is not None:
                self._probe.cancel()
            if self._lane is not None:
                await self._lane.close()
            await self._redis.aclose()

    # -- helpers -----------------------------------------------------------------------------

    def _check_open(self) -> None:
        """Called first by every method: a closed store raises :class:`StoreError`, and one
        whose server is known to be unreachable :class:`StoreUnavailable`, at once."""
        if self._closed:
            raise StoreError(f"redis store {self.url} is closed")
        if self._down is not None:
            raise StoreUnavailable(self._down)

    def _error(self, action: str, exc: _Failure) -> StoreError:
        # redis-py's messages name the host and the failure, never the URL's password.
        message = f"redis store {self.url}: cannot {action}: {exc}"
        if isinstance(exc, _OUTAGES) or (isinstance(exc, RedisClusterException)
                                         and "slot" not in str(exc)):
            self._mark_down(message)
            return StoreUnavailable(message)
        return StoreError(message)

    def _mark_down(self, why: str) -> None:
        """Fail fast from now on, until a probe's PING is answered."""
        self._down = why
        self._health = None
        if not self._closed and (self._probe is None or self._probe.done()):
            self._probe = asyncio.get_running_loop().create_task(self._probe_until_up())

    async def _probe_until_up(self) -> None:
        while not self._closed:
            await asyncio.sleep(PROBE_INTERVAL_S)
            if await self._ping():
                self._down = None
                return

    async def _ping(self) -> bool:
        """Whether the server answers a PING within :data:`PROBE_TIMEOUT_S`."""
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                await self._redis.ping()
        except (*_FAILURES, TimeoutError, OSError):
            return False
        return True

    def _audit_error(self, action: str, exc: _Failure) -> StoreError:
        if isinstance(exc, ResponseError) and ("WRONGTYPE" in str(exc)
                                               or "cjson" in str(exc).lower()):
            return CorruptStateError("<audit log>", f"cannot {action}: a key does not hold "
                                     "what the audit log keeps there")
        return self._error(action, exc)

    def _write_error(self, session_id: str, action: str, exc: _Failure) -> StoreError:
        if isinstance(exc, ResponseError) and str(exc).startswith("WRONGTYPE"):
            return CorruptStateError(session_id, "the state key is not a hash")
        return self._error(action, exc)

    def _decode(self, session_id: str, version: bytes | None, state_json: bytes | None,
                updated_at: bytes | None) -> StoredState:
        if version is None:
            raise CorruptStateError(session_id, "field 'version' is missing")
        if state_json is None:
            raise CorruptStateError(session_id, "field 'state' is missing")
        if updated_at is None:
            raise CorruptStateError(session_id, "field 'updated_at' is missing")
        try:
            number = int(version)
        except ValueError:
            number = 0
        if number < 1:
            raise CorruptStateError(session_id, "version is not an integer >= 1")
        try:
            stamp = updated_at.decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptStateError(session_id, "updated_at is not UTF-8") from None
        return decode_state(session_id, number, state_json, stamp)

    # --- replica consistency ---
    # proxy.state.store.base.ReplicaConsistency. A session's versioned records are fields of
    # its record hash; their versions, fields of the same name in the hash
    # ``record_versions_key`` (in the session's slot); each script touches one session's keys.

    @property
    def shared(self) -> bool:
        """Always: any number of processes may use the same server."""
        return True

    def record_versions_key(self, session_id: str) -> str:
        """The Redis key of the hash of the session's record versions (``kind -> n``)."""
        return f"{self.record_key(session_id)}-versions"

    async def _replica_script(self, text: str, keys: Sequence[str],
                              args: Sequence[Any]) -> Any:
        """Run the script ``text`` on ``keys`` (one session's, or one lease's) with ``args``:
        EVALSHA itself, on the lane where there is one (redis-py's script object costs ~8 µs
        more a call, its client ~40 µs more than the lane, and the versions read and the
        calibration save run on every request); a server that does not hold the script
        (NOSCRIPT: restarted, or a new node) gets it through that object, which loads it."""
        script = self._replica_scripts.get(text)
        if script is None:
            script = self._replica_scripts[text] = self._redis.register_script(text)
        try:
            if self._lane is not None:
                return await self._lane.call("EVALSHA", script.sha, len(keys), *keys, *args)
            return await self._redis.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            return await script(keys=list(keys), args=list(args))

    async def session_versions(self, session_id: str,
                               fetch: RecordFetch | None = None) -> SessionVersions:
        """The state's version and every record version of the session, and the records
        ``fetch`` wants: one round trip (a pipeline; with ``fetch``, one script, so the
        records are those of the versions read)."""
        self._check_open()
        fetched: dict[str, tuple[int, bytes]] = {}
        try:
            if fetch is None:
                async with self._redis.pipeline(transaction=False) as pipe:
                    pipe.hmget(self.state_key(session_id), ["version", "updated_at"])
                    pipe.hgetall(self.record_versions_key(session_id))
                    (version, updated_at), records = await pipe.execute()
            else:
                held = [item for kind, number in fetch.held.items() for item in (kind, number)]
                (version, updated_at), flat, found = await self._replica_script(
                    _VERSIONS_AND_RECORDS_LUA,
                    (self.state_key(session_id), self.record_versions_key(session_id),
                     self.record_key(session_id)), (fetch.prefix, *held))
                records = dict(zip(flat[::2], flat[1::2], strict=True))
        except _FAILURES as exc:
            raise self._error("read versions", exc) from exc
        try:
            versions = {_as_text(kind): int(number) for kind, number in records.items()}
        except ValueError:
            raise CorruptStateError(session_id, "a version is not an integer") from None
        if fetch is not None:
            for kind, data in zip(found[::2], found[1::2], strict=True):
                name = _as_text(kind)
                if isinstance(data, bytes) and name in versions:
                    fetched[name] = (versions[name], data)
        return SessionVersions(None if version is None else int(version),
                               None if updated_at is None else _as_text(updated_at),
                               versions, fetched)

    async def get_versioned_record(self, session_id: str, kind: str
                                   ) -> tuple[int, bytes] | None:
        """The record ``kind`` and its version, read by one script."""
        self._check_open()
        try:
            version, data = await self._replica_script(
                _GET_VERSIONED_LUA,
                (self.record_key(session_id), self.record_versions_key(session_id)), (kind,))
        except _FAILURES as exc:
            raise self._error("read record", exc) from exc
        if version is None or data is None:
            return None
        return int(version), bytes(_as_bytes(data) or b"")

    async def put_versioned_record(self, session_id: str, kind: str, data: bytes) -> int:
        """Replace the record ``kind`` and bump its version, in one script."""
        self._check_open()
        try:
            version = await self._replica_script(
                _PUT_VERSIONED_LUA,
                (self.record_key(session_id), self.record_versions_key(session_id)),
                (kind, bytes(data)))
        except _FAILURES as exc:
            raise self._error("write record", exc) from exc
        return int(version)

    async def acquire_lock(self, name: str, token: str, ttl_ms: int) -> bool:
        """``SET lock token NX PX ttl``."""
        self._check_open()
        try:
            taken = await self._redis.set(self.lock_key(name), token, nx=True,
                                          px=_ttl_ms(ttl_ms))
        except _FAILURES as exc:
            raise self._error("take lock", exc) from exc
        return bool(taken)

    async def extend_lock(self, name: str, token: str, ttl_ms: int) -> bool:
        """``PEXPIRE`` the lease if it still holds ``token`` (one script)."""
        self._check_open()
        try:
            done = await self._replica_script(_EXTEND_LOCK_LUA, (self.lock_key(name),),
                                              (token, _ttl_ms(ttl_ms)))
        except _FAILURES as exc:
            raise self._error("extend lock", exc) from exc
        return bool(done)

    async def release_lock(self, name: str, token: str) -> bool:
        """Delete the lease if it still holds ``token`` (compare-and-delete, one script)."""
        self._check_open()
        try:
            done = await self._replica_script(_RELEASE_LOCK_LUA, (self.lock_key(name),),
                                              (token,))
        except _FAILURES as exc:
            raise self._error("release lock", exc) from exc
        return bool(done)


# --- replica consistency: scripts (each on one session's keys, or one lease's) ---

# KEYS = the state hash, the record versions hash, the records hash; ARGV = a kind prefix,
# then (kind, version) pairs the caller holds. Returns the state's version and write time,
# every record version (flat), and (kind, data) of each record of the prefix whose version
# is not the one held (flat): the versions and those records from one moment.
_VERSIONS_AND_RECORDS_LUA: Final = """
local state = redis.call('HMGET', KEYS[1], 'version', 'updated_at')
local versions = redis.call('HGETALL', KEYS[2])
local prefix = ARGV[1]
local held = {}
for i = 2, #ARGV, 2 do held[ARGV[i]] = ARGV[i + 1] end
local found = {}
for i = 1, #versions, 2 do
    local kind = versions[i]
    if string.sub(kind, 1, #prefix) == prefix and held[kind] ~= versions[i + 1] then
        found[#found + 1] = kind
        found[#found + 1] = redis.call('HGET', KEYS[3], kind)
    end
end
return {state, versions, found}
"""

# KEYS = the record hash, the record versions hash; ARGV = kind. Returns {version, data}.
_GET_VERSIONED_LUA: Final = """
return {redis.call('HGET', KEYS[2], ARGV[1]), redis.call('HGET', KEYS[1], ARGV[1])}
"""

# KEYS as above; ARGV = kind, data. Returns the record's new version.
_PUT_VERSIONED_LUA: Final = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
"""

# KEYS = the lease; ARGV = token, ttl (ms). 1 when renewed.
_EXTEND_LOCK_LUA: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# KEYS = the lease; ARGV = token. 1 when this holder's lease was deleted.
_RELEASE_LOCK_LUA: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""


def _ttl_ms(ttl_ms: int) -> int:
    if ttl_ms < 1:
        raise ValueError(f"ttl_ms must be >= 1, got {ttl_ms}")
    return int(ttl_ms)


def _check_page(offset: int, limit: int) -> None:
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be an integer >= 0, got {offset!r}")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be an integer >= 1, got {limit!r}")
