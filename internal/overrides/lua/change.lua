-- change.lua puts or deletes one override and moves the version, in one
-- step, returning the value it replaced.
-- KEYS[1]: the hash of overrides, field = id, value = JSON
-- KEYS[2]: the version counter
-- ARGV[1]: the id; ARGV[2]: the JSON, or "" to delete;
-- ARGV[3]: the most overrides; ARGV[4]: "1" when the override is a wildcard;
-- ARGV[5]: the most wildcards; ARGV[6]: the wildcards now held (by the caller's count)
local old = redis.call('HGET', KEYS[1], ARGV[1])
if ARGV[2] == '' then
  if not old then
    return {'', -1}
  end
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  if not old then
    if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then
      return redis.error_reply('FULL too many overrides')
    end
    if ARGV[4] == '1' and tonumber(ARGV[6]) >= tonumber(ARGV[5]) then
      return redis.error_reply('FULL too many wildcard overrides')
    end
  end
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
local v = redis.call('INCR', KEYS[2])
return {old or '', v}
