-- change.lua puts or deletes one override and moves the version, in one
-- step, returning the value it replaced.
-- KEYS[1]: the hash of overrides, field = id, value = JSON
-- KEYS[2]: the version counter
-- ARGV[1]: the id; ARGV[2]: the JSON, or "" to delete;
-- ARGV[3]: the most overrides; ARGV[4]: "1" when the override is a wildcard;
-- ARGV[5]: the most wildcards, counted here: the fields whose identity
-- (after the policy's '|') holds a '*'. At most ARGV[3] fields, on an
-- admin's change only.
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
    if ARGV[4] == '1' then
      local wild = 0
      for _, id in ipairs(redis.call('HKEYS', KEYS[1])) do
        local bar = string.find(id, '|', 1, true)
        if bar and string.find(id, '*', bar + 1, true) then
          wild = wild + 1
        end
      end
      if wild >= tonumber(ARGV[5]) then
        return redis.error_reply('FULL too many wildcard overrides')
      end
    end
  end
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
local v = redis.call('INCR', KEYS[2])
return {old or '', v}
