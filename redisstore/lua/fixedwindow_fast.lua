-- Fixed window, the Envoy hot path: the same algorithm as fixedwindow.lua
-- with main.lua, without the batch machinery. One key (KEYS[1]): ARGV is
-- op ('1' allow, '2' peek, '3' refund, '4' charge), the period (its whole seconds, or when not whole its nanoseconds negated),
-- rate, cost, then, from a test only, now as seconds and nanoseconds
-- (else Redis TIME). The effective cost is max(cost, 1). Every ARGV value
-- costs Redis about 1,100 instructions and every tonumber about 1,700
-- (gcra_fast.lua), hence the packed period and the op compared as a
-- string. The key holds "START COUNT" for the current epoch-aligned
-- window and expires when the window ends.
-- Reply: allowed, count, elapsed.
-- A group (more than one key, as gcra_fast.lua's, commit.go): ARGV holds
-- runs of five, count, op, period, rate, cost, each for the next count
-- KEYS, on Redis TIME read once; the reply holds one reply as above per
-- key, or an error for a key that is not a string or whose write Redis
-- refused (OOM), without failing the others.
local A, K, tonumber = ARGV, KEYS, tonumber
local ns, nn

-- window returns, for a period argument pa, the period p in ns, the time
-- e since the window's start (lib.lua's elapsed) and the start as a
-- decimal Unix-ns string (lib.lua's abs(-e)), at now.
local function window(pa)
  local p, ps = -pa, 0
  if pa > 0 then p, ps = pa * 1e9, pa end
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
  local t = nn - e
  local s = math.floor(t / 1e9)
  local r = t - s * 1e9
  if r < 0 then s = s - 1; r = r + 1e9 elseif r >= 1e9 then s = s + 1; r = r - 1e9 end
  s = ns + s
  if s <= 0 then return p, e, string.format('%d', s * 1e9 + r) end
  return p, e, string.format('%d%09d', s, r)
end

-- step decides op on key k in the window (p, e, start); ttl is the
-- window's remaining ms as a string.
local function step(k, op, rate, cost, p, e, start, ttl)
  local eff = cost
  if eff < 1 then eff = 1 end
  if cost > 4503599627370496 then cost = 4503599627370496 end -- algo.MaxCount
  local c = 0
  local v = redis.pcall('GET', k)
  if type(v) == 'table' then return v end -- an error: not a string
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
    if v then redis.pcall('DEL', k) end
  else
    local w = redis.pcall('SET', k, start .. ' ' .. string.format('%d', c), 'PX', ttl)
    if w.err then return w end -- OOM under maxmemory: this key's write only
  end
  return { 1, c, e }
end

local n = #K
if n == 1 then
  if A[5] then
    ns, nn = tonumber(A[5]), tonumber(A[6])
  else
    local t = redis.call('TIME')
    ns, nn = tonumber(t[1]), tonumber(t[2]) * 1000
  end
  local p, e, start = window(tonumber(A[2]))
  return step(K[1], A[1], tonumber(A[3]), tonumber(A[4]), p, e, start, string.format('%d', math.ceil((p - e) / 1e6)))
end
local t = redis.call('TIME')
ns, nn = tonumber(t[1]), tonumber(t[2]) * 1000
local out, i, j = {}, 1, 1
while i <= n do
  local c, op, rate, cost = tonumber(A[j]), A[j + 1], tonumber(A[j + 3]), tonumber(A[j + 4])
  local p, e, start = window(tonumber(A[j + 2]))
  local ttl = string.format('%d', math.ceil((p - e) / 1e6))
  for _ = 1, c do
    out[i] = step(K[i], op, rate, cost, p, e, start, ttl)
    i = i + 1
  end
  j = j + 5
end
return out
