-- Token bucket for one key, the hot path: the same algorithm as
-- tokenbucket.lua with main.lua, without the batch machinery. KEYS[1] is
-- the key; ARGV as in gcra_fast.lua. The key holds "LEVEL LAST" (level in
-- nanoseconds of refill, Unix-ns time of measurement) and expires when the
-- bucket would be full; a full bucket is deleted. Reply: allowed, level.
local op, tau, inc, chg = tonumber(ARGV[1]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local ns, nn
if ARGV[2] == '' then
  local t = redis.call('TIME')
  ns, nn = tonumber(t[1]), tonumber(t[2]) * 1000
else
  ns, nn = tonumber(ARGV[2]), tonumber(ARGV[3])
end
local k = KEYS[1]
local level = tau
local v = redis.call('GET', k)
if v then
  local i = string.find(v, ' ', 1, true)
  local l = #v
  local since = (ns - tonumber(string.sub(v, i + 1, l - 9))) * 1e9 + (nn - tonumber(string.sub(v, l - 8)))
  if since < 0 then since = 0 end
  level = tonumber(string.sub(v, 1, i - 1)) + since
  if level > tau then level = tau end
end
if op <= 2 then
  if level < inc then return { 0, level } end
  if op == 2 then return { 1, level } end
  level = level - chg
elseif op == 3 then
  level = level + chg
  if level > tau then level = tau end
else
  level = level - chg
end
if level >= tau then
  if v then redis.call('DEL', k) end
else
  redis.call('SET', k, string.format('%d %d%09d', level, ns, nn), 'PX', math.ceil((tau - level) / 1e6))
end
return { 1, level }
