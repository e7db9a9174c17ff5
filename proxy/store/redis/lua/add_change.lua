-- KEYS = the session's changes zset; ARGV = the change's JSON, its score, max entries, the
-- retention cutoff score. Returns the newest change's score, or false when none is left.
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[4])
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(tonumber(ARGV[3]) + 1))
local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if #newest == 0 then return false end
return newest[2]
