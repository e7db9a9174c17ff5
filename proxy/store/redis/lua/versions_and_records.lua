-- KEYS = the state hash, the record versions hash, the records hash; ARGV = a kind prefix,
-- then (kind, version) pairs the caller holds. Returns the state's version and write time,
-- every record version (flat), and (kind, data) of each record of the prefix whose version
-- is not the one held (flat): the versions and those records from one moment.
local state = redis.call('HMGET', KEYS[1], 'version', 'updated_at')
local versions = redis.call('HGETALL', KEYS[2])
local prefix = ARGV[1]
local held = {}
for i = 2, #ARGV, 2 do held[ARGV[i]] = ARGV[i + 1] end
local found = {}
for i = 1, #versions, 2 do
    local kind = versions[i]
    if string.sub(kind, 1, #prefix) == prefix and held[kind] ~= versions[i + 1] then
        found[#found + 1] = kind
        found[#found + 1] = redis.call('HGET', KEYS[3], kind)
    end
end
return {state, versions, found}
