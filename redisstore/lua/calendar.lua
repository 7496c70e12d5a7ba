-- Calendar window: a fixed window whose boundaries come from a calendar in
-- a time zone. Lua knows no time zones, so Go sends the boundaries of the
-- windows around its own clock, as ascending whole Unix seconds in the
-- lease slot: "b1 b2 ... bn". The script picks the window [b(i), b(i+1))
-- that holds Redis's time; when none does, the client's clock is too far
-- from Redis's and main.lua replies {-2, seconds, nanoseconds} of Redis
-- TIME without touching anything, so that Go computes the boundaries
-- around that time and calls again. The key holds "START COUNT", START the
-- window's first Unix second, and expires when the window ends.
-- Reply: allowed, count, whole seconds from Redis's second to the window's
-- end, and Redis's nanoseconds within its second (the time to the end is
-- seconds·1e9 − nanoseconds, exact in Go).
ALGOS[16] = {
  prep = function(q)
    local b = split(q.lease)
    -- Boundaries are whole seconds: s <= now < e compares NS alone.
    for i = 1, #b - 1 do
      local s, e = tonumber(b[i]), tonumber(b[i + 1])
      if s and e and s <= NS and NS < e then
        q.ws, q.te = b[i], e - NS
        return true
      end
    end
    return false
  end,
  load = function(k, q)
    local v = redis.call('GET', k)
    if v then
      local f = split(v)
      if f[1] == q.ws then return tonumber(f[2]) end
    end
    return 0
  end,
  step = function(c, op, q)
    if op <= 2 then
      if c + q.eff > q.rate then return 0, c, q.te, NN end
      if op == 2 then return 1, c, q.te, NN end
      c = c + q.cost
    elseif op == 3 then
      -- A refund naming its charge's window (q.inc = -ReservedAhead, ns)
      -- applies only when now + ReservedAhead lies past this window's
      -- middle (algo.SameWindow); else it is dropped.
      local ws = tonumber(q.ws)
      if q.inc < 0 and 2 * (((NS - ws) * 1e9 + NN) - q.inc) <= (NS + q.te - ws) * 1e9 then return 1, c, q.te, NN end
      c = c - q.cost
      if c < 0 then c = 0 end
    else
      c = c + q.cost
      if c > MAXCOUNT then c = MAXCOUNT end
    end
    return 1, c, q.te, NN, c
  end,
  save = function(k, c, q)
    if c == 0 then
      redis.call('DEL', k)
    else
      -- ceil((te·1e9 − NN) / 1e6) ms: the key lapses with the window.
      redis.call('SET', k, q.ws .. ' ' .. fmt(c), 'PX', q.te * 1000 - math.floor(NN / 1e6))
    end
  end,
}
