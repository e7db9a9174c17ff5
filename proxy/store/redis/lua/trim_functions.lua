-- The trim of one session's audit entries, shared by the add and trim scripts.
-- KEYS = the session's entries zset, its totals hash; ARGV[1] = max entries, ARGV[2] = the
-- retention cutoff score. Each entry dropped is subtracted from the totals; a session left
-- without entries loses both keys. trim() returns {entries removed, 1 if the session is gone,
-- the refused entries removed (for the caller to take out of the blocked index), the
-- session's last_score ('' when gone)}.
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
