-- KEYS = the row's hash; ARGV = last_seen, then (counter, increment) pairs. last_seen only
-- moves forward (fixed-width ISO text compares as the times do). The index is not here: it
-- is in another slot (the caller adds the row to it first).
for i = 2, #ARGV, 2 do
    redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
end
local seen = redis.call('HGET', KEYS[1], 'last_seen')
if not seen or seen < ARGV[1] then
    redis.call('HSET', KEYS[1], 'last_seen', ARGV[1])
end
return 0
