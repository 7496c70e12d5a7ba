-- Fixed window for one key, the Envoy hot path: the same algorithm as
-- fixedwindow.lua with main.lua, without the batch machinery. KEYS[1] is
-- the key; ARGV is op ('1' allow, '2' peek, '3' refund, '4' charge), the
-- period (its whole seconds, or when not whole its nanoseconds negated),
-- rate, cost, then, from a test only, now as seconds and nanoseconds
-- (else Redis TIME). The effective cost is max(cost, 1). Every ARGV value
-- costs Redis about 1,100 instructions and every tonumber about 1,700
-- (gcra_fast.lua), hence the packed period and the op compared as a
-- string. The key holds "START COUNT" for the current epoch-aligned
-- window and expires when the window ends.
-- Reply: allowed, count, elapsed.
local A, tonumber = ARGV, tonumber
local op, pa, rate, cost = A[1], tonumber(A[2]), tonumber(A[3]), tonumber(A[4])
local p, ps = -pa, 0
if pa > 0 then p, ps = pa * 1e9, pa end
local eff = cost
if eff < 1 then eff = 1 end
if cost > 4503599627370496 then cost = 4503599627370496 end -- algo.MaxCount
local ns, nn
if A[5] then
  ns, nn = tonumber(A[5]), tonumber(A[6])
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
local k = KEYS[1]
local c = 0
local v = redis.call('GET', k)
if v then
  local l = #start
  if string.sub(v, 1, l + 1) == start .. ' ' then c = tonumber(string.sub(v, l + 2)) end
end
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
  if v then redis.call('DEL', k) end
else
  redis.call('SET', k, start .. ' ' .. string.format('%d', c), 'PX', string.format('%d', math.ceil((p - e) / 1e6)))
end
return { 1, c, e }
