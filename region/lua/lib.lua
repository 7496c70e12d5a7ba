-- The time in ms: ARGV[1] when a test sends its clock, else Redis TIME, so
-- that both instances of a region read one clock.
local function now_ms()
  local t = tonumber(ARGV[1])
  if t then return t end
  local r = redis.call('TIME')
  return tonumber(r[1]) * 1000 + math.floor(tonumber(r[2]) / 1000)
end

-- A share: n units this region may spend (negative: a debt left by a
-- charge), usable until exp (ms), for window win ('' for buckets), last
-- spent at last.
local function load(key)
  local h = redis.call('HMGET', key, 'n', 'exp', 'win', 'last')
  return tonumber(h[1]) or 0, tonumber(h[2]) or 0, h[3] or '', tonumber(h[4]) or 0
end
