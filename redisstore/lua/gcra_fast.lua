-- GCRA and token bucket, the hot path: the same algorithm as gcra.lua (and
-- tokenbucket.lua) with main.lua, without the batch machinery. A token
-- bucket is a GCRA whose level is tau − (TAT − now), so both store the
-- TAT; the client turns the reply into a level. A key holds the TAT as a
-- decimal Unix-ns integer and expires when it passes.
--
-- One key (KEYS[1]): ARGV is op ('1' allow, '2' peek, '3' refund, '4'
-- charge), tau, the interval of the effective cost, then the interval of
-- the cost when it differs (a cost of 0) or a test's time follows, then,
-- from a test only, now as seconds and nanoseconds (else Redis TIME).
-- Reply: TAT − now, an integer, when allowed; { 0, TAT − now } when denied.
--
-- A group (more than one key, the group commit's calls gathered into one,
-- commit.go): ARGV holds runs of five, count, op, tau, interval of the
-- effective cost, interval of the cost, each for the next count KEYS, in
-- order; the time is Redis TIME, read once. Reply: one reply as above per
-- key, in order, or an error for a key that is not a string (WRONGTYPE)
-- or whose write Redis refused (OOM), without failing the others (a
-- denial writes nothing, and is answered under OOM as alone).
--
-- An admission's integer reply, not a table, saves 9% of the script's
-- Redis instructions per call (callgrind, docs/BENCHMARKS.md); a denial
-- keeps the table, so that the reply stays exact past 2^53 (no sign or
-- offset arithmetic on a Lua double). Every ARGV value costs Redis about
-- 1,100 instructions and every tonumber about 1,700 (glibc's strtod): op
-- is compared as a string, the cost's interval is left out when it is the
-- effective cost's, the time is Redis's unless a test sends one, and a
-- group sends each limit's values once. A group also shares EVALSHA's own
-- cost and TIME among its keys.
local A, K, tonumber = ARGV, KEYS, tonumber
local ns, nn

local function step(k, op, tau, inc, chg)
  local tat = 0
  local v = redis.pcall('GET', k)
  if type(v) == 'table' then return v end -- an error: not a string
  if v then
    local l = #v
    local i = string.find(v, ' ', 1, true)
    if not i then
      tat = (tonumber(string.sub(v, 1, l - 9)) - ns) * 1e9 + (tonumber(string.sub(v, l - 8)) - nn)
    else -- "LEVEL LAST", a token bucket written by an older sluice
      tat = (tonumber(string.sub(v, i + 1, l - 9)) - ns) * 1e9 + (tonumber(string.sub(v, l - 8)) - nn) + tau - tonumber(string.sub(v, 1, i - 1))
    end
    if tat < 0 then tat = 0 end
    -- a debt an older sluice let grow past algo.MaxAhead reads as that
    if tat > 1152921504606846976 then tat = 1152921504606846976 end
  end
  if op == '1' or op == '2' then
    if tat + inc - tau > 0 then return { 0, tat } end
    if op == '2' then return tat end
    tat = tat + chg
  elseif op == '3' then
    tat = tat - chg
    if tat < 0 then tat = 0 end
  else
    tat = tat + chg
    -- algo.MaxAhead (2^60 ns): a charge leaves the key at most that far in debt
    if tat > 1152921504606846976 then tat = 1152921504606846976 end
  end
  if tat > 0 then
    local t = nn + tat
    local s = math.floor(t / 1e9)
    local r = t - s * 1e9
    if r < 0 then s = s - 1; r = r + 1e9 elseif r >= 1e9 then s = s + 1; r = r - 1e9 end
    -- the TTL as a string: a Lua number becomes one through '%.17g'
    local w = redis.pcall('SET', k, string.format('%d%09d', ns + s, r), 'PX', string.format('%d', math.ceil(tat / 1e6)))
    if w.err then return w end -- OOM under maxmemory: this key's write only
  elseif v then
    redis.pcall('DEL', k)
  end
  return tat
end

local n = #K
if n == 1 then
  local inc = tonumber(A[3])
  local chg = inc
  if A[4] then chg = tonumber(A[4]) end
  if A[5] then
    ns, nn = tonumber(A[5]), tonumber(A[6])
  else
    local t = redis.call('TIME')
    ns, nn = tonumber(t[1]), tonumber(t[2]) * 1000
  end
  return step(K[1], A[1], tonumber(A[2]), inc, chg)
end
local t = redis.call('TIME')
ns, nn = tonumber(t[1]), tonumber(t[2]) * 1000
local out, i, j = {}, 1, 1
while i <= n do
  local c, op, tau, inc, chg = tonumber(A[j]), A[j + 1], tonumber(A[j + 2]), tonumber(A[j + 3]), tonumber(A[j + 4])
  for _ = 1, c do
    out[i] = step(K[i], op, tau, inc, chg)
    i = i + 1
  end
  j = j + 5
end
return out
