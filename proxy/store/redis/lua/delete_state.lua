-- After state_change.lua. KEYS = state hash, tombstone, changes zset; ARGV = expected
-- version ("" = any), then the change (its JSON, its score, max entries, the retention cutoff
-- score; all "" when none). Returns {1, 0, newest change score or ''} when deleted, {0, 0}
-- when no state existed, {2, current} on a conflict, {-1, 0} when a version is expected but
-- the stored one is not a positive integer, {-2, 0} when the changes key holds something else
-- than a zset. Without an expected version anything under the key goes, so a DELETE can
-- always clear a broken state (the tombstone keeps its version when it has one).
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
