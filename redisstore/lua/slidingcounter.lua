-- Sliding window counter: the key holds "START CURR PREV": the current
-- window's start and count and the previous window's count. It expires when
-- both counts have slid out. Reply: allowed, curr, prev, elapsed.
ALGOS[4] = {
  load = function(k, q)
    local v = redis.call('GET', k)
    if v then
      local f = split(v)
      local ws = rel(f[1])
      if ws == -q.e then return { tonumber(f[2]), tonumber(f[3]) } end
      if ws == -q.e - q.p then return { 0, tonumber(f[2]) } end
    end
    return { 0, 0 }
  end,
  step = function(st, op, q)
    local curr, prev = st[1], st[2]
    if op <= 2 then
      local need = curr + q.eff
      if need > q.rate or not mulle(prev, q.p - q.e, q.rate - need, q.p) then return 0, curr, prev, q.e end
      if op == 2 then return 1, curr, prev, q.e end
      curr = curr + q.cost
    elseif op == 3 then
      curr = curr - q.cost
      if curr < 0 then curr = 0 end
    else
      curr = curr + q.cost
      if curr > MAXCOUNT then curr = MAXCOUNT end
    end
    return 1, curr, prev, q.e, { curr, prev }
  end,
  save = function(k, st, q)
    local curr, prev = st[1], st[2]
    if curr == 0 and prev == 0 then
      redis.call('DEL', k)
      return
    end
    local ttl = q.p - q.e
    if curr > 0 then ttl = ttl + q.p end
    redis.call('SET', k, abs(-q.e) .. ' ' .. fmt(curr) .. ' ' .. fmt(prev), 'PX', ms(ttl))
  end,
}
