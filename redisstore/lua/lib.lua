-- sluice redisstore: the helpers every script starts with.
--
-- Lua numbers are doubles, exact for integers below 2^53 but not for Unix
-- times in nanoseconds (~1.8e18). So inside a script the current time is 0:
-- stored absolute times (decimal Unix ns strings) become offsets from now
-- when read (rel) and absolute again when written (abs), and all arithmetic
-- is on durations, exact below 2^53 ns (104 days).
--
-- ARGV[1] is the operation (1 allow, 2 peek, 3 refund, 4 charge). ARGV[2]
-- and ARGV[3] are the current time as seconds and nanoseconds, passed only
-- by tests; production passes '' and the time comes from Redis TIME.
--
-- A test's time is not Redis's: a test may hold its clock while seconds of
-- real time pass on a loaded machine, and Redis expires keys by its own
-- clock. So with a test's time every TTL is an hour longer (TTLSLACK). A
-- key's TTL only collects it once its state no longer matters; what the
-- state means is decided from the times stored in it.
local ALGOS = {}
local NS, NN
local TTLSLACK = 0
if ARGV[2] == '' then
  local t = redis.call('TIME')
  NS, NN = tonumber(t[1]), tonumber(t[2]) * 1000
else
  NS, NN = tonumber(ARGV[2]), tonumber(ARGV[3])
  TTLSLACK = 3600000
end

-- rel turns a decimal Unix-ns string into nanoseconds since now.
local function rel(v)
  local l = #v
  if l <= 9 then return tonumber(v) - NN - NS * 1e9 end
  return (tonumber(string.sub(v, 1, l - 9)) - NS) * 1e9 + (tonumber(string.sub(v, l - 8)) - NN)
end

-- abs turns nanoseconds since now into a decimal Unix-ns string.
local function abs(d)
  local t = NN + d
  local s = math.floor(t / 1e9)
  local r = t - s * 1e9
  if r < 0 then s = s - 1; r = r + 1e9 elseif r >= 1e9 then s = s + 1; r = r - 1e9 end
  s = NS + s
  if s <= 0 then return string.format('%d', s * 1e9 + r) end
  return string.format('%d%09d', s, r)
end

-- ms is a TTL in whole milliseconds, rounded up, at least 1.
local function ms(d)
  local m = math.ceil(d / 1e6)
  if m < 1 then m = 1 end
  return m + TTLSLACK
end

-- split cuts "a b c" at spaces.
local function split(v)
  local out, i = {}, 1
  while true do
    local j = string.find(v, ' ', i, true)
    if not j then out[#out + 1] = string.sub(v, i); return out end
    out[#out + 1] = string.sub(v, i, j - 1)
    i = j + 1
  end
end

-- elapsed is now modulo the period p: the time since the start of the
-- current epoch-aligned window. ps is p in whole seconds, or 0 when p is not
-- a whole number of seconds (then p·10 must stay below 2^53: Go checks).
local function elapsed(p, ps)
  if ps > 0 then return (NS % ps) * 1e9 + NN end
  local x = NS % p
  for _ = 1, 9 do
    x = (x * 10) % p
    if x < 0 then x = x + p end
  end
  x = (x + NN) % p
  if x < 0 then x = x + p end
  return x
end

-- mulle reports a·b <= c·d exactly, for non-negative integers below 2^56.
local function mulle(a, b, c, d)
  local x, y = a * b, c * d
  if x < 4503599627370496 and y < 4503599627370496 then return x <= y end
  local B = 16777216
  local function prod(u, v)
    local u0, v0 = u % B, v % B
    local u1, v1 = math.floor(u / B) % B, math.floor(v / B) % B
    local u2, v2 = math.floor(u / (B * B)), math.floor(v / (B * B))
    local r = { u0 * v0, u0 * v1 + u1 * v0, u0 * v2 + u1 * v1 + u2 * v0, u1 * v2 + u2 * v1, u2 * v2 }
    for i = 1, 4 do
      local carry = math.floor(r[i] / B)
      r[i] = r[i] - carry * B
      r[i + 1] = r[i + 1] + carry
    end
    return r
  end
  local l, g = prod(a, b), prod(c, d)
  for i = 5, 1, -1 do
    if l[i] ~= g[i] then return l[i] < g[i] end
  end
  return true
end

-- MAXAHEAD is algo.MaxAhead (2^60 ns, exact as a double): a charge leaves a
-- GCRA or token bucket key at most that far in debt. MAXCOUNT is
-- algo.MaxCount (2^52): a charge counts at most that, and a count stops
-- there, so count + cost stays exact and a reply or fmt never wraps.
local MAXAHEAD, MAXCOUNT = 1152921504606846976, 4503599627370496

-- fmt writes an integer-valued number without exponent.
local function fmt(n) return string.format('%d', n) end
