-- Fixed window: the key holds "START COUNT" for the current epoch-aligned
-- window and expires when the window ends. Reply: allowed, count, elapsed.
ALGOS[5] = {
  load = function(k, q)
    local v = redis.call('GET', k)
    if v then
      local f = split(v)
      if rel(f[1]) == -q.e then return tonumber(f[2]) end
    end
    return 0
  end,
  step = function(c, op, q)
    if op <= 2 then
      if c + q.eff > q.rate then return 0, c, q.e, 0 end
      if op == 2 then return 1, c, q.e, 0 end
      c = c + q.cost
    elseif op == 3 then
      -- A refund naming its charge's window (q.inc = -ReservedAhead, ns)
      -- applies only when that window is this one: now + ReservedAhead
      -- past this window's middle (algo.SameWindow); else it is dropped.
      if q.inc < 0 and 2 * (q.e - q.inc) <= q.p then return 1, c, q.e, 0 end
      c = c - q.cost
      if c < 0 then c = 0 end
    else
      c = c + q.cost
      if c > MAXCOUNT then c = MAXCOUNT end
    end
    return 1, c, q.e, 0, c
  end,
  save = function(k, c, q)
    if c == 0 then
      redis.call('DEL', k)
    else
      redis.call('SET', k, abs(-q.e) .. ' ' .. fmt(c), 'PX', ms(q.p - q.e))
    end
  end,
}
