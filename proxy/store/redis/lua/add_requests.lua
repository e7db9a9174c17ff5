-- After trim_functions.lua. KEYS as the trim; ARGV as the trim, then for each entry of one
-- session (a batch): its JSON, its score, its ISO time, tokens_before, tokens_after, blocked
-- (0/1). A member already there is not counted again. The session's last_seen (ISO text, and
-- last_score, the same time as a score) only moves forward. Returns the trim's reply (once,
-- after every entry).
for at = 3, #ARGV, 6 do
    if redis.call('ZADD', KEYS[1], ARGV[at + 1], ARGV[at]) == 1 then
        redis.call('HINCRBY', KEYS[2], 'requests', 1)
        redis.call('HINCRBY', KEYS[2], 'tokens_before', ARGV[at + 3])
        redis.call('HINCRBY', KEYS[2], 'tokens_after', ARGV[at + 4])
        redis.call('HINCRBY', KEYS[2], 'blocked', ARGV[at + 5])
    end
    local seen = redis.call('HGET', KEYS[2], 'last_seen')
    if not seen or seen < ARGV[at + 2] then
        redis.call('HSET', KEYS[2], 'last_seen', ARGV[at + 2], 'last_score', ARGV[at + 1])
    end
end
return trim()
