-- Sliding window log: the key is a list of runs, oldest first, each "T" or
-- "T*N": N admitted units (default 1) at Unix-ns time T. A run counts while
-- T + period > now; at most Rate units are kept. Runs keep the memory per
-- key at O(distinct instants), at most O(Rate), and make a cost of N one
-- entry. The key expires when its newest run slides out. With a
-- granularity of q.g milliseconds, units are stamped at the end of their
-- q.g-long slot (algo.SlotEnd), so a slot's units share a run and a key
-- holds at most period/q.g + 1 runs.
-- Reply: allowed, count, retry-after, reset-after.
local function logtotal(runs)
  local n = 0
  for i = 1, #runs do n = n + runs[i][2] end
  return n
end

-- slotend is the stamp of a unit admitted a ns ago, relative to now (so
-- 0 for an exact log and a of 0): now − a rounded up to a multiple of g
-- ms since the Unix epoch. a comes as a decimal string of ns, split into
-- whole ms and the rest as text, so that it is exact at any size. Now − a
-- in whole ms, NS·1000 + floor(NN/1e6) − floor(a/1e6), borrowing one for
-- a negative rest, is exact in a double (below 2^53), and so is the
-- stamp's offset from NS·1000 ms.
local function slotend(g, a)
  if g <= 0 and a == '0' then return 0 end
  local am, ar = 0, tonumber(a)
  local l = #a
  if l > 6 then am, ar = tonumber(string.sub(a, 1, l - 6)), tonumber(string.sub(a, l - 5)) end
  local m = NS * 1000 + math.floor(NN / 1e6) - am
  local sub = NN % 1e6 - ar
  if sub < 0 then m, sub = m - 1, sub + 1e6 end
  local e = m
  if g > 0 then
    e = m - m % g
    if e < m or sub > 0 then e, sub = e + g, 0 end
  end
  return (e - NS * 1000) * 1e6 + sub - NN
end

-- dropupto removes up to c units from the newest runs of out stamped at
-- or before t, in place (algo's dropUpTo); the runs after t stay.
local function dropupto(out, t, c)
  local j = #out
  while j > 0 and out[j][1] > t do j = j - 1 end
  local k, left = j, c
  while left > 0 and k > 0 do
    local r = out[k]
    if r[2] <= left then
      left = left - r[2]
      k = k - 1
    else
      out[k] = { r[1], r[2] - left }
      left = 0
    end
  end
  if k == j then return out end
  local kept = {}
  for i = 1, k do kept[#kept + 1] = out[i] end
  for i = j + 1, #out do kept[#kept + 1] = out[i] end
  return kept
end
ALGOS[3] = {
  load = function(k, q)
    local runs = {}
    local raw = redis.call('LRANGE', k, 0, -1)
    for i = 1, #raw do
      local v = raw[i]
      local j = string.find(v, '*', 1, true)
      local t, c
      if j then
        t, c = rel(string.sub(v, 1, j - 1)), tonumber(string.sub(v, j + 1))
      else
        t, c = rel(v), 1
      end
      if t + q.p > 0 then runs[#runs + 1] = { t, c } end
    end
    return { runs, logtotal(runs), #raw }
  end,
  step = function(st, op, q)
    local runs, n = st[1], st[2]
    local last = 0
    if n > 0 then last = runs[#runs][1] + q.p end
    if op <= 2 then
      local c = q.eff
      if n + c > q.rate then
        local idx, acc, t = n + c - q.rate, 0, 0
        for i = 1, #runs do
          acc = acc + runs[i][2]
          if acc >= idx then t = runs[i][1]; break end
        end
        return 0, n, t + q.p, last
      end
      if op == 2 then return 1, n, 0, last end
    end
    local out = {}
    for i = 1, #runs do out[i] = runs[i] end
    if op == 3 then
      -- A refund takes the newest units, or with an age the newest
      -- stamped at or before the slot end of now − age (algo's
      -- RefundBound), never a later admission's.
      local t = math.huge
      if q.age ~= '0' then t = slotend(q.g, q.age) end
      out = dropupto(out, t, q.cost)
    else
      -- Units stamped no later than the newest run join it (algo's
      -- appendRun): a stamp in the same slot, or behind a clock that
      -- stepped back, so the runs stay ascending.
      local t = slotend(q.g, '0')
      local r = out[#out]
      if r and r[1] >= t then
        out[#out] = { r[1], r[2] + q.cost }
      else
        out[#out + 1] = { t, q.cost }
      end
      local over = logtotal(out) - q.rate
      local drop = 0
      while over > 0 do
        local f = out[drop + 1]
        if f[2] <= over then
          over = over - f[2]
          drop = drop + 1
        else
          out[drop + 1] = { f[1], f[2] - over }
          over = 0
        end
      end
      if drop > 0 then
        local kept = {}
        for i = drop + 1, #out do kept[#kept + 1] = out[i] end
        out = kept
      end
    end
    local total = logtotal(out)
    last = 0
    if total > 0 then last = out[#out][1] + q.p end
    return 1, total, 0, last, { out, total, st[3] }
  end,
  save = function(k, st, q)
    local runs = st[1]
    redis.call('DEL', k)
    if #runs == 0 then return end
    local batch = {}
    for i = 1, #runs do
      local r = runs[i]
      if r[2] == 1 then batch[#batch + 1] = abs(r[1]) else batch[#batch + 1] = abs(r[1]) .. '*' .. fmt(r[2]) end
      if #batch == 256 or i == #runs then
        redis.call('RPUSH', k, unpack(batch))
        batch = {}
      end
    end
    redis.call('PEXPIRE', k, ms(runs[#runs][1] + q.p))
  end,
}
