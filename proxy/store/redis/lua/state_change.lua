-- Shared by put_state.lua and delete_state.lua.
-- add_change(member, score, max entries, cutoff): the change into KEYS[3], trimmed by
-- age and count; returns the newest change's score ('' when none is left).
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
