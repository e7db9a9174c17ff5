"""The Redis store's durable-state writes: each one Lua script with the change it records.

*Versions are never reused.* Deleting a state leaves ``<prefix>{<session key>}:tombstone``
holding its last version; a state created again starts after it (and the tombstone goes), so
a writer still holding the ETag of a deleted state gets a conflict, never a silent overwrite.

*A write and its change record are one script.* The change goes into the session's changes
sorted set (``...:audit:changes``, in the state's hash slot) and the set is trimmed in the
script that writes the state, so both are kept or neither. Redis does not roll a script back
when a command in it fails, so the script checks every key's type before its first write.
The version a ``put`` writes is decided in the script: its change is sent as the JSON text
before and after the version's value, which the script joins around it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

from proxy.state.audit_log import StateChange

from ._rows import encode_audit

__all__ = ["DELETE_STATE_LUA", "PUT_STATE_LUA", "delete_change_args", "put_change_args"]

# add_change(member, score, max entries, cutoff score): the change into KEYS[3], trimmed by
# age and count; returns the newest change's score ('' when none is left).
_ADD_CHANGE: Final = """
local function add_change(member, score, max, cutoff)
    redis.call('ZADD', KEYS[3], score, member)
    redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. cutoff)
    redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -(tonumber(max) + 1))
    local newest = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
    if #newest == 0 then return '' end
    return newest[2]
end
local function changes_writable()
    local kind = redis.call('TYPE', KEYS[3]).ok
    return kind == 'zset' or kind == 'none'
end
"""

# KEYS = state hash, tombstone, changes zset; ARGV = expected version ("" = must not exist),
# state JSON, updated_at, then the change (its JSON before and after the version, its score,
# max entries, the retention cutoff score; all "" when there is none).
# Returns {1, new_version, newest change score or ''} on success, {0, current_version} on a
# conflict (-1: no state), {-1, 0} when the key holds something that is not a state with a
# positive integer version, {-2, 0} when the changes key holds something else than a zset.
PUT_STATE_LUA: Final = _ADD_CHANGE + """
local current = redis.call('HGET', KEYS[1], 'version')
local new
if current then
    local cur = tonumber(current)
    if cur == nil or cur < 1 or cur ~= math.floor(cur) then return {-1, 0} end
    if ARGV[1] == '' or tonumber(ARGV[1]) ~= cur then return {0, cur} end
    new = cur + 1
else
    if redis.call('EXISTS', KEYS[1]) == 1 then return {-1, 0} end
    if ARGV[1] ~= '' then return {0, -1} end
    new = (tonumber(redis.call('GET', KEYS[2])) or 0) + 1
end
if ARGV[4] ~= '' and not changes_writable() then return {-2, 0} end
redis.call('HSET', KEYS[1], 'version', new, 'state', ARGV[2], 'updated_at', ARGV[3])
redis.call('DEL', KEYS[2])
local newest = ''
if ARGV[4] ~= '' then
    newest = add_change(ARGV[4] .. string.format('%d', new) .. ARGV[5], ARGV[6], ARGV[7],
                        ARGV[8])
end
return {1, new, newest}
"""

# KEYS = state hash, tombstone, changes zset; ARGV = expected version ("" = any), then the
# change (its JSON, its score, max entries, the retention cutoff score; all "" when none).
# Returns {1, 0, newest change score or ''} when deleted, {0, 0} when no state existed,
# {2, current} on a conflict, {-1, 0} when a version is expected but the stored one is not a
# positive integer, {-2, 0} when the changes key holds something else than a zset. Without an
# expected version anything under the key goes, so a DELETE can always clear a broken state
# (the tombstone keeps its version when it has one).
DELETE_STATE_LUA: Final = _ADD_CHANGE + """
if redis.call('EXISTS', KEYS[1]) == 0 then return {0, 0} end
local cur = nil
if redis.call('TYPE', KEYS[1]).ok == 'hash' then
    cur = tonumber(redis.call('HGET', KEYS[1], 'version'))
    if cur ~= nil and (cur < 1 or cur ~= math.floor(cur)) then cur = nil end
end
if ARGV[1] ~= '' then
    if cur == nil then return {-1, 0} end
    if cur ~= tonumber(ARGV[1]) then return {2, cur} end
end
local last = tonumber(redis.call('GET', KEYS[2])) or 0
if ARGV[2] ~= '' and not changes_writable() then return {-2, 0} end
redis.call('DEL', KEYS[1])
if cur ~= nil then redis.call('SET', KEYS[2], string.format('%d', math.max(cur, last))) end
local newest = ''
if ARGV[2] ~= '' then newest = add_change(ARGV[2], ARGV[3], ARGV[4], ARGV[5]) end
return {1, 0, newest}
"""

_VERSION_FIELD: Final = '"version":null'


def delete_change_args(change: StateChange | None, score: str, max_changes: int,
                       cutoff: str) -> list[Any]:
    """A delete's change arguments: the change's JSON, its score, the bound and the cutoff
    (all empty without a change)."""
    if change is None:
        return ["", "", "", ""]
    return [encode_audit(change), score, max_changes, cutoff]


def put_change_args(change: StateChange | None, score: str, max_changes: int,
                    cutoff: str) -> list[Any]:
    """A put's change arguments: the change's JSON cut where the version written goes, then
    as :func:`delete_change_args`. ``"version":null`` is found once, and only as the field
    itself: inside a JSON string every ``"`` is escaped."""
    if change is None:
        return ["", "", "", "", ""]
    text = encode_audit(dataclasses.replace(change, version=None))
    head, found, tail = text.partition(_VERSION_FIELD)
    if not found:  # (as_json always writes the field; kept as a loud failure)
        raise ValueError("a state change's JSON has no version field")
    return [head + '"version":', tail, score, max_changes, cutoff]
