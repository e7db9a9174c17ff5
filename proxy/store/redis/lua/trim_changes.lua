-- KEYS = the session's changes zset; ARGV[1] = the retention cutoff score. Returns {how many
-- changes went, the newest one's score or ''}.
local removed = redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[1])
local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if #newest == 0 then return {removed, ''} end
return {removed, newest[2]}
