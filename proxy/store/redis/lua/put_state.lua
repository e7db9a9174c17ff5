-- After state_change.lua. KEYS = state hash, tombstone, changes zset; ARGV = expected
-- version ("" = must not exist), state JSON, updated_at, then the change (its JSON before and
-- after the version, its score, max entries, the retention cutoff score; all "" when there is
-- none). Returns {1, new_version, newest change score or ''} on success, {0, current_version}
-- on a conflict (-1: no state), {-1, 0} when the key holds something that is not a state with
-- a positive integer version, {-2, 0} when the changes key holds something else than a zset.
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
