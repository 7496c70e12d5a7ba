-- Fixed window for one key in per-window keys (Options.PlainWindows): the
-- same algorithm as fixedwindow_fast.lua, but KEYS[1] is a base name (see
-- plain.go) and the count of the window starting at START (Unix ns,
-- decimal) is the plain integer in KEYS[1]..':'..START, which the store
-- also changes directly with SET NX and INCRBY mid-window. A denied INCRBY
-- stays counted, so the count may stand above the rate: allow and peek
-- then deny, refund subtracts (clamped at 0). The key's TTL runs past the
-- window's end by the slack: it only collects garbage.
-- ARGV is as fixedwindow_fast.lua's: op, period (whole seconds, or ns
-- negated), rate, cost, then slack (ms), then, from a test only, now as
-- seconds and nanoseconds. Reply: allowed, count, elapsed.
local A, tonumber = ARGV, tonumber
local op, pa, rate, cost = A[1], tonumber(A[2]), tonumber(A[3]), tonumber(A[4])
local slack = tonumber(A[5])
local p, ps = -pa, 0
if pa > 0 then p, ps = pa * 1e9, pa end
local eff = cost
if eff < 1 then eff = 1 end
if cost > 4503599627370496 then cost = 4503599627370496 end -- algo.MaxCount
local ns, nn
if A[6] then
  ns, nn = tonumber(A[6]), tonumber(A[7])
else
  local t = redis.call('TIME')
  ns, nn = tonumber(t[1]), tonumber(t[2]) * 1000
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
if op == '1' or op == '2' then
  if c + eff > rate then return { 0, c, e } end
  if op == '2' then return { 1, c, e } end
  c = c + cost
elseif op == '3' then
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
