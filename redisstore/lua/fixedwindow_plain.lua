-- Fixed window for one key in per-window keys (Options.PlainWindows): the
-- same algorithm as fixedwindow_fast.lua, but KEYS[1] is a base name (see
-- plain.go) and the count of the window starting at START (Unix ns,
-- decimal) is the plain integer in KEYS[1]..':'..START, which the store
-- also changes directly with SET NX and INCRBY mid-window. A denied INCRBY
-- stays counted, so the count may stand above the rate: allow and peek
-- then deny, refund subtracts (clamped at 0). The key's TTL runs past the
-- window's end by ARGV[9] ms: it only collects garbage.
-- ARGV is op, now seconds, now nanoseconds ('' '' for Redis TIME), period
-- (ns), period in whole seconds (0 if not whole), rate, effective cost,
-- cost, slack (ms). Reply: allowed, count, elapsed.
local op, p, ps, rate, eff, cost = tonumber(ARGV[1]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), math.min(tonumber(ARGV[8]), 4503599627370496)
local slack = tonumber(ARGV[9])
local ns, nn
if ARGV[2] == '' then
  local t = redis.call('TIME')
  ns, nn = tonumber(t[1]), tonumber(t[2]) * 1000
else
  ns, nn = tonumber(ARGV[2]), tonumber(ARGV[3])
end
-- e: now modulo p, as lib.lua's elapsed.
local e
if ps > 0 then
  e = (ns % ps) * 1e9 + nn
else
  local x = ns % p
  for _ = 1, 9 do
    x = (x * 10) % p
    if x < 0 then x = x + p end
  end
  x = (x + nn) % p
  if x < 0 then x = x + p end
  e = x
end
-- start: the window's start as a decimal Unix-ns string, as lib.lua's abs(-e).
local t = nn - e
local s = math.floor(t / 1e9)
local r = t - s * 1e9
if r < 0 then s = s - 1; r = r + 1e9 elseif r >= 1e9 then s = s + 1; r = r - 1e9 end
s = ns + s
local start
if s <= 0 then start = string.format('%d', s * 1e9 + r) else start = string.format('%d%09d', s, r) end
local k = KEYS[1] .. ':' .. start
local c = tonumber(redis.call('GET', k) or '0')
if c < 0 then c = 0 end
if op <= 2 then
  if c + eff > rate then return { 0, c, e } end
  if op == 2 then return { 1, c, e } end
  c = c + cost
elseif op == 3 then
  c = c - cost
  if c < 0 then c = 0 end
else
  c = c + cost
  if c > 4503599627370496 then c = 4503599627370496 end -- algo.MaxCount
end
if c == 0 then
  redis.call('DEL', k)
else
  redis.call('SET', k, string.format('%d', c), 'PX', math.ceil((p - e) / 1e6) + slack)
end
return { 1, c, e }
