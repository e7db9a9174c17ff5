-- KEYS = the record hash, the record versions hash; ARGV = kind, data. Returns the
-- record's new version.
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
