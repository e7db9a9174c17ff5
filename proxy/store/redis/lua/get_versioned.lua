-- KEYS = the record hash, the record versions hash; ARGV = kind. Returns {version, data}.
return {redis.call('HGET', KEYS[2], ARGV[1]), redis.call('HGET', KEYS[1], ARGV[1])}
