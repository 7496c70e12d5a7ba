-- GCRA: the key holds the theoretical arrival time (TAT), a decimal Unix-ns
-- integer (stored by Redis as an int: the smallest value encoding), and
-- expires when the TAT passes, which is when the bucket is full again.
-- Reply: allowed, TAT − now.
ALGOS[1] = {
  load = function(k)
    local v = redis.call('GET', k)
    if v then return math.min(rel(v), MAXAHEAD) end
    return 0
  end,
  step = function(tat, op, q)
    if tat < 0 then tat = 0 end
    if op <= 2 then
      if tat + q.inc - q.tau > 0 then return 0, tat, 0, 0 end
      if op == 2 then return 1, tat, 0, 0 end
      tat = tat + q.chg
    elseif op == 3 then
      -- q.inc < 0: the refund of a reservation whose state reached -q.inc
      -- ahead; what later admissions reserved behind it is kept (algo's
      -- refundable)
      local back = q.chg
      if q.inc < 0 and tat + q.inc > 0 then
        back = back - (tat + q.inc)
        if back < 0 then back = 0 end
      end
      tat = tat - back
      if tat < 0 then tat = 0 end
    else
      tat = tat + q.chg
      if tat > MAXAHEAD then tat = MAXAHEAD end
    end
    return 1, tat, 0, 0, tat
  end,
  save = function(k, tat)
    if tat > 0 then
      redis.call('SET', k, abs(tat), 'PX', ms(tat))
    else
      redis.call('DEL', k)
    end
  end,
}
