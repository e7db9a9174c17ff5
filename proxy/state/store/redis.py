"""The shared store backend: one Redis server, safe for any number of proxy processes.

Theory of operation
-------------------
*Layout.* Every key starts with ``key_prefix`` (default ``compact-proxy:``), so several
deployments can share one database. Because the variable part (the session id) always comes
last, two namespaces can never collide, whatever characters a session id holds:

- ``<prefix>state:<session_id>``: a hash ``{version, state, updated_at}``; ``state`` is the
  canonical JSON of ``DurableContextState.to_dict()``, ``updated_at`` an ISO timestamp (UTC);
- ``<prefix>summary:text``: a hash ``key -> summary text``;
  ``<prefix>summary:order``: a sorted set of the same keys scored by insertion sequence, and
  ``<prefix>summary:seq``: the counter that hands out those sequence numbers;
- ``<prefix>record:<session_id>``: a hash ``kind -> bytes``;
- ``<prefix>usage:row:<["session key","model"]>``: a hash of one usage row, each counter of
  :class:`~proxy.state.usage.UsageEntry` under its field name plus ``last_seen`` (ISO, UTC);
  the two variable parts are a JSON array, so no session key or model name can collide;
  ``<prefix>usage:rows``: the set of those JSON arrays, which ``usage_rows`` lists;
- the audit log, per session ``<["tenant","session id"]>`` (a JSON array, like a usage row):
  ``<prefix>audit:requests:<session>``, a sorted set of request entries (their JSON) scored by
  arrival time (Unix seconds); ``<prefix>audit:totals:<session>``, a hash of the session's
  totals over those entries (``requests``, ``tokens_before``, ``tokens_after``, ``blocked``,
  ``last_seen`` as ISO text); ``<prefix>audit:sessions``, a sorted set of the sessions scored
  by ``last_seen``; ``<prefix>audit:blocked``, a sorted set of every refused entry (the same
  JSON) by time; ``<prefix>audit:changes:<session>``, a sorted set of state changes by time,
  and ``<prefix>audit:changed``, the sessions that have some.

*Compare-and-swap in one script.* Redis runs a Lua script atomically: no other client's
command runs between its first and its last step. The write script reads the current version,
compares it with the caller's and writes the new hash, so of several writers racing from the
same version (in this process or another) exactly one wins; the others get the new version
back and raise :class:`~proxy.state.store.base.VersionConflict`. The delete and the summary-cache
scripts (insert if absent, then evict the oldest beyond the bound) and the usage script (every
``HINCRBY`` of a row, its ``last_seen`` and its index entry) are atomic the same way, and
so is each audit write: the entry, the session's totals, the indexes and the trim (the
session's oldest entries beyond the bound, and those older than the retention, each
subtracted from the totals as it goes) happen in one script.
Scripts are sent once and then called by their SHA (``EVALSHA``; redis-py reloads them if the
server forgot them).

*One server.* All the keys a script touches are named in ``KEYS``, but the summary keys do
not share a hash slot, so Redis Cluster is not supported; a single server (or a primary with
replicas) is.

*Durability* is whatever the server is configured for (RDB snapshots, AOF). The summaries and
records are caches; a lost admin write shows up as an older version, so the admin's next
``If-Match`` gets a clean 409 rather than a silent overwrite.

*Never garbage.* A state hash that does not decode (missing field, bad version, bad JSON, a
state that does not validate, a key of another type) raises
:class:`~proxy.state.store.base.CorruptStateError`. Every other Redis failure is a
:class:`~proxy.state.store.base.StoreError` whose message names the server without its password.

Everything in ``__all__`` gets re-exported by ``proxy.state.store``, on first use: importing
``proxy.state.store`` does not import redis-py; naming ``proxy.state.store.RedisStateStore`` does.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Final, Self, cast
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

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

from ._rows import (
    audit_stamp,
    check_bounds,
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
from .base import CorruptStateError, SessionVersions, StoredState, StoreError, VersionConflict

__all__ = ["RedisStateStore"]

# KEYS[1] = state hash; ARGV = expected version ("" = must not exist), state JSON, updated_at.
# Returns {1, new_version} on success, {0, current_version} on a conflict (-1: no state),
# {-1, 0} when the key holds something that is not a state with a positive integer version.
_PUT_STATE_LUA: Final = """
local current = redis.call('HGET', KEYS[1], 'version')
local new = 1
if current then
    local cur = tonumber(current)
    if cur == nil or cur < 1 or cur ~= math.floor(cur) then return {-1, 0} end
    if ARGV[1] == '' or tonumber(ARGV[1]) ~= cur then return {0, cur} end
    new = cur + 1
else
    if redis.call('EXISTS', KEYS[1]) == 1 then return {-1, 0} end
    if ARGV[1] ~= '' then return {0, -1} end
end
redis.call('HSET', KEYS[1], 'version', new, 'state', ARGV[2], 'updated_at', ARGV[3])
return {1, new}
"""

# KEYS[1] = state hash; ARGV[1] = expected version ("" = any).
# Returns {1, 0} when deleted, {0, 0} when no state existed, {2, current} on a conflict,
# {-1, 0} when a version is expected but the stored one is not a positive integer. Without an
# expected version anything under the key goes, so a DELETE can always clear a broken state.
_DELETE_STATE_LUA: Final = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {0, 0} end
if ARGV[1] ~= '' then
    if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then return {-1, 0} end
    local cur = tonumber(redis.call('HGET', KEYS[1], 'version'))
    if cur == nil or cur < 1 or cur ~= math.floor(cur) then return {-1, 0} end
    if cur ~= tonumber(ARGV[1]) then return {2, cur} end
end
redis.call('DEL', KEYS[1])
return {1, 0}
"""

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

# KEYS = the row's hash, the rows index set; ARGV = the row's index member, last_seen, then
# (counter, increment) pairs. last_seen only moves forward (fixed-width ISO text compares as
# the times do).
_ADD_USAGE_LUA: Final = """
for i = 3, #ARGV, 2 do
    redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
end
local seen = redis.call('HGET', KEYS[1], 'last_seen')
if not seen or seen < ARGV[2] then
    redis.call('HSET', KEYS[1], 'last_seen', ARGV[2])
end
redis.call('SADD', KEYS[2], ARGV[1])
return 0
"""


# The trim of one session's audit entries, shared by the add and trim scripts.
# KEYS = the session's entries zset, its totals hash, the sessions zset, the blocked zset;
# ARGV[1] = the session's member, ARGV[2] = max entries, ARGV[3] = the retention cutoff score.
# Each entry dropped is subtracted from the totals (and leaves the blocked index); a session
# left without entries goes entirely. trim() returns how many entries went.
_TRIM_FUNCTIONS_LUA: Final = """
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
            redis.call('ZREM', KEYS[4], m)
        end
        redis.call('ZREM', KEYS[1], m)
    end
    return #members
end
local function trim()
    local removed = drop(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[3]))
    local excess = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[2])
    if excess > 0 then
        removed = removed + drop(redis.call('ZRANGE', KEYS[1], 0, excess - 1))
    end
    if redis.call('ZCARD', KEYS[1]) == 0 then
        redis.call('DEL', KEYS[1], KEYS[2])
        redis.call('ZREM', KEYS[3], ARGV[1])
    end
    return removed
end
"""

_TRIM_SESSION_LUA: Final = _TRIM_FUNCTIONS_LUA + "return trim()\n"

# KEYS as the trim; ARGV as the trim, then the entry's JSON, its score, its ISO time,
# tokens_before, tokens_after, blocked (0/1). A member already there is not counted again.
# The session's last_seen (the hash's ISO text, the zset's score) only moves forward; the
# blocked index is trimmed by age as well (its other entries' sessions are trimmed on their
# next write, or by trim()).
_ADD_REQUEST_LUA: Final = _TRIM_FUNCTIONS_LUA + """
if redis.call('ZADD', KEYS[1], ARGV[5], ARGV[4]) == 1 then
    redis.call('HINCRBY', KEYS[2], 'requests', 1)
    redis.call('HINCRBY', KEYS[2], 'tokens_before', ARGV[7])
    redis.call('HINCRBY', KEYS[2], 'tokens_after', ARGV[8])
    redis.call('HINCRBY', KEYS[2], 'blocked', ARGV[9])
    if ARGV[9] == '1' then redis.call('ZADD', KEYS[4], ARGV[5], ARGV[4]) end
end
local seen = redis.call('HGET', KEYS[2], 'last_seen')
if not seen or seen < ARGV[6] then
    redis.call('HSET', KEYS[2], 'last_seen', ARGV[6])
    redis.call('ZADD', KEYS[3], ARGV[5], ARGV[1])
end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. ARGV[3])
return trim()
"""

# KEYS = the session's changes zset, the changed-sessions zset; ARGV = the session's member,
# the change's JSON, its score, max entries, the retention cutoff score.
_ADD_CHANGE_LUA: Final = """
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[5])
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(tonumber(ARGV[4]) + 1))
local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if #newest == 0 then
    redis.call('ZREM', KEYS[2], ARGV[1])
else
    redis.call('ZADD', KEYS[2], newest[2], ARGV[1])
end
return 0
"""

# KEYS = the session's changes zset, the changed-sessions zset; ARGV = the session's member,
# the retention cutoff score. Returns how many changes went.
_TRIM_CHANGES_LUA: Final = """
local removed = redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[2])
if redis.call('ZCARD', KEYS[1]) == 0 then
    redis.call('ZREM', KEYS[2], ARGV[1])
end
return removed
"""


def _as_bytes(value: bytes | str | None) -> bytes | None:
    # The client is built with decode_responses=False, so replies are bytes; the str branch
    # only satisfies redis-py's types (which allow both).
    return value.encode("utf-8") if isinstance(value, str) else value


def _as_text(value: bytes | str) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value


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


class RedisStateStore:
    """The :class:`~proxy.state.store.base.StoreBackend` backed by a Redis server.

    Construction does no I/O (the connection pool connects lazily); :meth:`open` PINGs the
    server, which is what the service calls at startup so an unreachable server fails before
    anything is served.

    Args:
        url: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://…`` (TLS) or
            ``unix:///path/to/socket[?db=N]``; redis-py options in the query string (e.g.
            ``?socket_timeout=2``) win over the defaults below.
        max_summaries: how many summaries the cache keeps before evicting the oldest.
        key_prefix: the prefix of every key this store reads or writes.
        timeout_s: connect and per-command socket timeout.
        max_requests_per_session: how many request entries a session keeps in the audit log.
        retention_days: how long audit entries are kept.

    Raises:
        ValueError: a bound is out of range, the prefix is empty or the URL is not a Redis URL.
    """

    def __init__(self, url: str, *, max_summaries: int = 1000,
                 key_prefix: str = "compact-proxy:", timeout_s: float = 5.0,
                 max_requests_per_session: int = DEFAULT_MAX_REQUESTS_PER_SESSION,
                 retention_days: int = DEFAULT_RETENTION_DAYS) -> None:
        if max_summaries < 1:
            raise ValueError(f"max_summaries must be >= 1, got {max_summaries}")
        check_bounds(max_requests_per_session, retention_days)
        self.max_requests_per_session = max_requests_per_session
        self.retention_days = retention_days
        if not key_prefix:
            raise ValueError("key_prefix must not be empty")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.url = redacted_url(url)
        self.max_summaries = max_summaries
        self.key_prefix = key_prefix
        try:
            self._redis: aioredis.Redis = aioredis.Redis.from_url(
                url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s,
            )
        except ValueError as exc:
            # redis-py's messages name the scheme or option, never the URL itself.
            raise ValueError(f"invalid redis url {self.url}: {exc}") from None
        self._put_state_script = self._redis.register_script(_PUT_STATE_LUA)
        self._delete_state_script = self._redis.register_script(_DELETE_STATE_LUA)
        self._put_summary_script = self._redis.register_script(_PUT_SUMMARY_LUA)
        self._add_usage_script = self._redis.register_script(_ADD_USAGE_LUA)
        self._add_request_script = self._redis.register_script(_ADD_REQUEST_LUA)
        self._trim_session_script = self._redis.register_script(_TRIM_SESSION_LUA)
        self._add_change_script = self._redis.register_script(_ADD_CHANGE_LUA)
        self._trim_changes_script = self._redis.register_script(_TRIM_CHANGES_LUA)
        self._summary_keys = [f"{key_prefix}summary:text", f"{key_prefix}summary:order",
                              f"{key_prefix}summary:seq"]
        self._closed = False

    async def open(self) -> Self:
        """PING the server now; returns the store itself.

        Raises:
            StoreError: the server does not answer (or refuses the credentials); the store is
                closed.
        """
        try:
            self._check_open()
            await self._redis.ping()
        except RedisError as exc:
            await self.close()
            raise self._error("connect", exc) from None
        except BaseException:
            await self.close()
            raise
        return self

    def state_key(self, session_id: str) -> str:
        """The Redis key of the session's state hash."""
        return f"{self.key_prefix}state:{session_id}"

    def record_key(self, session_id: str) -> str:
        """The Redis key of the session's record hash."""
        return f"{self.key_prefix}record:{session_id}"

    def usage_key(self, session_key: str, model: str) -> str:
        """The Redis key of the usage row of ``(session_key, model)``."""
        return f"{self.key_prefix}usage:row:{_pair_member(session_key, model)}"

    @property
    def usage_index_key(self) -> str:
        """The Redis key of the set indexing every usage row."""
        return f"{self.key_prefix}usage:rows"

    def audit_keys(self, tenant: str, session_id: str) -> list[str]:
        """The keys of one session's audit log, as the scripts take them: its entries, its
        totals, the sessions index, the blocked index."""
        member = _pair_member(tenant, session_id)
        return [f"{self.key_prefix}audit:requests:{member}",
                f"{self.key_prefix}audit:totals:{member}",
                f"{self.key_prefix}audit:sessions", f"{self.key_prefix}audit:blocked"]

    def change_keys(self, tenant: str, session_id: str) -> list[str]:
        """The keys of one session's state changes: its changes, the changed-sessions index."""
        member = _pair_member(tenant, session_id)
        return [f"{self.key_prefix}audit:changes:{member}", f"{self.key_prefix}audit:changed"]

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
        except RedisError as exc:
            raise self._error("read state", exc) from exc
        version, state_json, updated_at = (_as_bytes(value) for value in values)
        if version is None and state_json is None and updated_at is None:
            return None
        return self._decode(session_id, version, state_json, updated_at)

    async def put_state(self, session_id: str, state: DurableContextState,
                        expected_version: int | None) -> StoredState:
        """Compare-and-swap write; see :meth:`proxy.state.store.base.StateStore.put_state`."""
        if not isinstance(state, DurableContextState):
            raise TypeError(f"state must be a DurableContextState, got {type(state).__name__}")
        self._check_open()
        state_json = encode_state(state)
        when = utc_now()
        when_text = when.isoformat()
        expected = "" if expected_version is None else str(int(expected_version))
        try:
            outcome, version = await self._put_state_script(
                keys=[self.state_key(session_id)], args=[expected, state_json, when_text]
            )
        except RedisError as exc:
            raise self._write_error(session_id, "write state", exc) from exc
        if outcome == -1:
            raise CorruptStateError(session_id, "stored version is not an integer >= 1")
        if outcome == 0:
            raise VersionConflict(session_id, expected_version, None if version < 0 else version)
        return StoredState(session_id=session_id, version=int(version), state=state,
                           updated_at=when)

    async def delete_state(self, session_id: str, expected_version: int | None = None) -> bool:
        """Delete the state; see :meth:`proxy.state.store.base.StateStore.delete_state`."""
        self._check_open()
        expected = "" if expected_version is None else str(int(expected_version))
        try:
            outcome, current = await self._delete_state_script(
                keys=[self.state_key(session_id)], args=[expected]
            )
        except RedisError as exc:
            raise self._write_error(session_id, "delete state", exc) from exc
        if outcome == -1:
            raise CorruptStateError(session_id, "stored version is not an integer >= 1")
        if outcome == 2:
            raise VersionConflict(session_id, expected_version, int(current))
        return bool(outcome == 1)

    async def get_summary(self, key: str) -> str | None:
        """Return the cached summary stored under ``key``, or ``None``."""
        self._check_open()
        try:
            raw = await self._redis.hget(self._summary_keys[0], key)
        except RedisError as exc:
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
        except RedisError as exc:
            raise self._error("write summary", exc) from exc

    async def get_record(self, session_id: str, kind: str) -> bytes | None:
        """Return the opaque compaction record ``kind`` of the session, or ``None``."""
        self._check_open()
        try:
            raw = await self._redis.hget(self.record_key(session_id), kind)
        except RedisError as exc:
            raise self._error("read record", exc) from exc
        return _as_bytes(raw)

    async def put_record(self, session_id: str, kind: str, data: bytes) -> None:
        """Store (replace) the opaque compaction record ``kind`` of the session."""
        self._check_open()
        try:
            await self._redis.hset(self.record_key(session_id), kind, bytes(data))
        except RedisError as exc:
            raise self._error("write record", exc) from exc

    async def add_usage(self, session_key: str, model: str, entry: UsageEntry) -> None:
        """Add ``entry`` to the row of ``(session_key, model)``; see
        :meth:`proxy.state.store.base.UsageLedger.add_usage`."""
        if not isinstance(entry, UsageEntry):
            raise TypeError(f"entry must be a UsageEntry, got {type(entry).__name__}")
        self._check_open()
        args: list[str | int] = [_pair_member(session_key, model), usage_stamp()]
        for name in UsageEntry.field_names():
            args += [name, getattr(entry, name)]
        try:
            await self._add_usage_script(
                keys=[self.usage_key(session_key, model), self.usage_index_key], args=args
            )
        except RedisError as exc:
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
        except RedisError as exc:
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

    async def add_request(self, entry: RequestEntry) -> None:
        """Keep ``entry``, then trim the session and the retention, in one script."""
        if not isinstance(entry, RequestEntry):
            raise TypeError(f"entry must be a RequestEntry, got {type(entry).__name__}")
        self._check_open()
        args = [*self._trim_args(entry.tenant, entry.session_id), encode_audit(entry),
                _score(entry.at), audit_stamp(entry.at), entry.tokens_before or 0,
                entry.tokens_after or 0, int(entry.blocked)]
        try:
            await self._add_request_script(keys=self.audit_keys(entry.tenant, entry.session_id),
                                           args=args)
        except RedisError as exc:
            raise self._audit_error("add audit entry", exc) from exc

    async def add_state_change(self, change: StateChange) -> None:
        """Keep ``change``, then trim the session's changes by count and age."""
        if not isinstance(change, StateChange):
            raise TypeError(f"change must be a StateChange, got {type(change).__name__}")
        self._check_open()
        member, _, cutoff = self._trim_args(change.tenant, change.session_id)
        try:
            await self._add_change_script(
                keys=self.change_keys(change.tenant, change.session_id),
                args=[member, encode_audit(change), _score(change.at),
                      self.max_requests_per_session, cutoff])
        except RedisError as exc:
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
        index = f"{self.key_prefix}audit:sessions"
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
        except RedisError as exc:
            raise self._audit_error("read audit sessions", exc) from exc
        return summaries, total

    async def session_requests(self, tenant: str, session_id: str, *, offset: int = 0,
                               limit: int = 100) -> tuple[list[RequestEntry], int]:
        """One page of a session's requests, newest first, and how many it has."""
        _check_page(offset, limit)
        self._check_open()
        key = self.audit_keys(tenant, session_id)[0]
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.zcard(key)
                pipe.zrevrange(key, offset, offset + limit - 1)
                total, members = await pipe.execute()
        except RedisError as exc:
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
        except RedisError as exc:
            raise self._audit_error("read state changes", exc) from exc
        return [decode_change(member) for member in _listed(members)]

    async def blocked_since(self, since: datetime, *, limit: int = 1000) -> list[RequestEntry]:
        """Refused requests that arrived at or after ``since``, oldest first."""
        _check_page(0, limit)
        self._check_open()
        try:
            members = await self._redis.zrangebyscore(f"{self.key_prefix}audit:blocked",
                                                      _score(since), "+inf", start=0, num=limit)
        except RedisError as exc:
            raise self._audit_error("read blocked requests", exc) from exc
        return [decode_entry(member) for member in _listed(members)]

    async def trim(self, now: datetime) -> int:
        """Drop the audit entries older than the retention at ``now``, session by session;
        returns how many went."""
        self._check_open()
        cutoff = _score(retention_cutoff(now, self.retention_days))
        removed = 0
        try:
            sessions = _listed(await self._redis.zrange(f"{self.key_prefix}audit:sessions", 0, -1))
            for tenant, session_id in [_pair_of(m, "<audit log>") for m in sessions]:
                member, maximum, _ = self._trim_args(tenant, session_id)
                removed += int(await self._trim_session_script(
                    keys=self.audit_keys(tenant, session_id), args=[member, maximum, cutoff]))
            await self._redis.zremrangebyscore(f"{self.key_prefix}audit:blocked", "-inf",
                                               f"({cutoff}")
            changed = _listed(await self._redis.zrange(f"{self.key_prefix}audit:changed", 0, -1))
            for tenant, session_id in [_pair_of(m, "<audit log>") for m in changed]:
                removed += int(await self._trim_changes_script(
                    keys=self.change_keys(tenant, session_id),
                    args=[_pair_member(tenant, session_id), cutoff]))
        except RedisError as exc:
            raise self._audit_error("trim the audit log", exc) from exc
        return removed

    async def _summaries(self, members: list[str]) -> list[SessionSummary]:
        """The totals of each session, in the order given."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for member in members:
                pipe.hgetall(f"{self.key_prefix}audit:totals:{member}")
            hashes = await pipe.execute()
        return [_totals(member, raw) for member, raw in zip(members, hashes, strict=True)]

    def _trim_args(self, tenant: str, session_id: str) -> list[Any]:
        """The trim script's ARGV for a session: its member, the bound, the cutoff score."""
        cutoff = retention_cutoff(utc_now(), self.retention_days)
        return [_pair_member(tenant, session_id), self.max_requests_per_session,
                _score(cutoff)]

    async def close(self) -> None:
        """Close the connection pool; idempotent. Later calls raise :class:`StoreError`."""
        if self._closed:
            return
        self._closed = True
        await self._redis.aclose()

    # -- helpers -----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"redis store {self.url} is closed")

    def _error(self, action: str, exc: RedisError) -> StoreError:
        # redis-py's messages name the host and the failure, never the URL's password.
        return StoreError(f"redis store {self.url}: cannot {action}: {exc}")

    def _audit_error(self, action: str, exc: RedisError) -> StoreError:
        if isinstance(exc, ResponseError) and ("WRONGTYPE" in str(exc)
                                               or "cjson" in str(exc).lower()):
            return CorruptStateError("<audit log>", f"cannot {action}: a key does not hold "
                                     "what the audit log keeps there")
        return self._error(action, exc)

    def _write_error(self, session_id: str, action: str, exc: RedisError) -> StoreError:
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

    def lock_key(self, name: str) -> str:
        """The Redis key of the lease ``name``."""
        return f"{self.key_prefix}lock:{name}"

    def _replica_script(self, text: str) -> Any:
        scripts: dict[str, Any] = self.__dict__.setdefault("_replica_scripts", {})
        script = scripts.get(text)
        if script is None:
            script = scripts[text] = self._redis.register_script(text)
        return script

    async def session_versions(self, session_id: str) -> SessionVersions:
        """The state's version and every record version of the session: one round trip."""
        self._check_open()
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.hmget(self.state_key(session_id), ["version", "updated_at"])
                pipe.hgetall(self.record_versions_key(session_id))
                (version, updated_at), records = await pipe.execute()
        except RedisError as exc:
            raise self._error("read versions", exc) from exc
        try:
            return SessionVersions(
                None if version is None else int(version),
                None if updated_at is None else _as_text(updated_at),
                {_as_text(kind): int(number) for kind, number in records.items()})
        except ValueError:
            raise CorruptStateError(session_id, "a version is not an integer") from None

    async def get_versioned_record(self, session_id: str, kind: str
                                   ) -> tuple[int, bytes] | None:
        """The record ``kind`` and its version, read by one script."""
        self._check_open()
        try:
            version, data = await self._replica_script(_GET_VERSIONED_LUA)(
                keys=[self.record_key(session_id), self.record_versions_key(session_id)],
                args=[kind])
        except RedisError as exc:
            raise self._error("read record", exc) from exc
        if version is None or data is None:
            return None
        return int(version), bytes(_as_bytes(data) or b"")

    async def put_versioned_record(self, session_id: str, kind: str, data: bytes) -> int:
        """Replace the record ``kind`` and bump its version, in one script."""
        self._check_open()
        try:
            version = await self._replica_script(_PUT_VERSIONED_LUA)(
                keys=[self.record_key(session_id), self.record_versions_key(session_id)],
                args=[kind, bytes(data)])
        except RedisError as exc:
            raise self._error("write record", exc) from exc
        return int(version)

    async def acquire_lock(self, name: str, token: str, ttl_ms: int) -> bool:
        """``SET lock token NX PX ttl``."""
        self._check_open()
        try:
            taken = await self._redis.set(self.lock_key(name), token, nx=True,
                                          px=_ttl_ms(ttl_ms))
        except RedisError as exc:
            raise self._error("take lock", exc) from exc
        return bool(taken)

    async def extend_lock(self, name: str, token: str, ttl_ms: int) -> bool:
        """``PEXPIRE`` the lease if it still holds ``token`` (one script)."""
        self._check_open()
        try:
            done = await self._replica_script(_EXTEND_LOCK_LUA)(
                keys=[self.lock_key(name)], args=[token, _ttl_ms(ttl_ms)])
        except RedisError as exc:
            raise self._error("extend lock", exc) from exc
        return bool(done)

    async def release_lock(self, name: str, token: str) -> bool:
        """Delete the lease if it still holds ``token`` (compare-and-delete, one script)."""
        self._check_open()
        try:
            done = await self._replica_script(_RELEASE_LOCK_LUA)(
                keys=[self.lock_key(name)], args=[token])
        except RedisError as exc:
            raise self._error("release lock", exc) from exc
        return bool(done)


# --- replica consistency: scripts (each on one session's keys, or one lease's) ---

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
