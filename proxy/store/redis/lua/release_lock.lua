-- KEYS = the lease; ARGV = token. 1 when this holder's lease was deleted.
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
