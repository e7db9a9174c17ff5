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
  ``<prefix>usage:rows``: the set of those JSON arrays, which ``usage_rows`` lists.

*Compare-and-swap in one script.* Redis runs a Lua script atomically: no other client's
command runs between its first and its last step. The write script reads the current version,
compares it with the caller's and writes the new hash, so of several writers racing from the
same version (in this process or another) exactly one wins; the others get the new version
back and raise :class:`~proxy.state.store.base.VersionConflict`. The delete and the summary-cache
scripts (insert if absent, then evict the oldest beyond the bound) and the usage script (every
``HINCRBY`` of a row, its ``last_seen`` and its index entry) are atomic the same way.
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
from typing import Final, Self
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from compactor import DurableContextState
from proxy.state.usage import UsageEntry, UsageRow

from ._rows import decode_state, decode_usage_row, encode_state, usage_stamp, utc_now
from .base import CorruptStateError, StoredState, StoreError, VersionConflict

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


def _as_bytes(value: bytes | str | None) -> bytes | None:
    # The client is built with decode_responses=False, so replies are bytes; the str branch
    # only satisfies redis-py's types (which allow both).
    return value.encode("utf-8") if isinstance(value, str) else value


def _as_text(value: bytes | str) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value


def _usage_member(session_key: str, model: str) -> str:
    """The index member (and key suffix) of a usage row: ``["session key","model"]``."""
    return json.dumps([session_key, model], ensure_ascii=False, separators=(",", ":"))


def _usage_pair(member: bytes | str) -> tuple[str, str]:
    """``(session_key, model)`` back from an index member."""
    try:
        pair = json.loads(member)
    except ValueError:
        pair = None
    if (not isinstance(pair, list) or len(pair) != 2
            or not all(isinstance(part, str) for part in pair)):
        raise CorruptStateError("<usage index>", "a member is not a [session key, model] pair")
    return pair[0], pair[1]


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

    Raises:
        ValueError: a bound is out of range, the prefix is empty or the URL is not a Redis URL.
    """

    def __init__(self, url: str, *, max_summaries: int = 1000,
                 key_prefix: str = "compact-proxy:", timeout_s: float = 5.0) -> None:
        if max_summaries < 1:
            raise ValueError(f"max_summaries must be >= 1, got {max_summaries}")
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
        return f"{self.key_prefix}usage:row:{_usage_member(session_key, model)}"

    @property
    def usage_index_key(self) -> str:
        """The Redis key of the set indexing every usage row."""
        return f"{self.key_prefix}usage:rows"

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
        args: list[str | int] = [_usage_member(session_key, model), usage_stamp()]
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
            pairs = sorted(_usage_pair(member) for member in members)
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
