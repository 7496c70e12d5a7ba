-- Concurrency: the key is a hash from lease id to "EXPIRY" or "EXPIRY*N",
-- N slots (default 1) held until Unix-ns EXPIRY. Lapsed leases are dropped
-- on every write; the key expires with its last lease.
-- Reply: allowed, slots used, retry-after, reset-after (a take's differs:
-- see step).
local function lastexpiry(leases)
  local m = 0
  for _, l in pairs(leases) do
    if l[1] > m then m = l[1] end
  end
  return m
end
ALGOS[6] = {
  load = function(k)
    local leases, used = {}, 0
    local raw = redis.call('HGETALL', k)
    for i = 1, #raw, 2 do
      local v = raw[i + 1]
      local j = string.find(v, '*', 1, true)
      local e, c
      if j then
        e, c = rel(string.sub(v, 1, j - 1)), tonumber(string.sub(v, j + 1))
      else
        e, c = rel(v), 1
      end
      if e > 0 then
        leases[raw[i]] = { e, c }
        used = math.min(used + c, MAXCOUNT)
      end
    end
    return { leases, used }
  end,
  step = function(st, op, q)
    local leases, used = st[1], st[2]
    local held = leases[q.lease]
    if op == 5 then
      -- Take: the lease is set to what is free besides it, up to the cost;
      -- nothing free releases it. Reply: allowed, slots used, slots taken
      -- (or, when none, the retry-after), reset-after.
      local others = used
      if held then others = used - held[2] end
      local n = q.rate - others
      if n > q.cost then n = q.cost end
      local out, rest = {}, {}
      for id, l in pairs(leases) do
        if id ~= q.lease then out[id] = l; rest[#rest + 1] = l end
      end
      if n > 0 then
        out[q.lease] = { q.p, n }
        return 1, others + n, n, lastexpiry(out), { out, others + n }
      end
      table.sort(rest, function(x, y) return x[1] < y[1] end)
      local need, freed, retry = others + 1 - q.rate, 0, 0
      for i = 1, #rest do
        freed = freed + rest[i][2]
        if freed >= need then retry = rest[i][1]; break end
      end
      return 0, others, retry, lastexpiry(out), { out, others }
    end
    if op <= 2 then
      local c = q.eff
      if held then c = 0 end
      if used + c > q.rate then
        local need, es = used + c - q.rate, {}
        for _, l in pairs(leases) do es[#es + 1] = l end
        table.sort(es, function(x, y) return x[1] < y[1] end)
        local freed, retry = 0, 0
        for i = 1, #es do
          freed = freed + es[i][2]
          if freed >= need then retry = es[i][1]; break end
        end
        return 0, used, retry, lastexpiry(leases)
      end
      if op == 2 then return 1, used, 0, lastexpiry(leases) end
    end
    if op == 3 and not held then
      return 0, used, 0, lastexpiry(leases) -- released already, or lapsed
    end
    local out = {}
    for id, l in pairs(leases) do out[id] = l end
    if op == 1 then
      if held then
        out[q.lease] = { q.p, held[2] }
      else
        out[q.lease] = { q.p, q.cost }
        used = used + q.cost
      end
    elseif op == 3 then
      if held then
        out[q.lease] = nil
        used = 0
        for _, l in pairs(out) do used = math.min(used + l[2], MAXCOUNT) end
      end
    else
      local c = q.cost
      if held then c = math.min(c + held[2], MAXCOUNT) end
      out[q.lease] = { q.p, c }
      used = math.min(used + q.cost, MAXCOUNT)
    end
    return 1, used, 0, lastexpiry(out), { out, used }
  end,
  save = function(k, st)
    redis.call('DEL', k)
    local args, last = {}, 0
    for id, l in pairs(st[1]) do
      args[#args + 1] = id
      if l[2] == 1 then args[#args + 1] = abs(l[1]) else args[#args + 1] = abs(l[1]) .. '*' .. fmt(l[2]) end
      if l[1] > last then last = l[1] end
      if #args >= 512 then
        redis.call('HSET', k, unpack(args))
        args = {}
      end
    end
    if #args > 0 then redis.call('HSET', k, unpack(args)) end
    if last > 0 then redis.call('PEXPIRE', k, ms(last)) end
  end,
}
