-- KEYS = text hash, order zset, sequence counter; ARGV = key, text, max entries.
-- Content-addressed: a key already cached keeps its text and its age. Then everything but the
-- newest ``max`` entries (by insertion sequence) is evicted.
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
