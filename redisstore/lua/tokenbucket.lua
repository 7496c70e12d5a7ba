-- Token bucket: the key holds the Unix-ns time at which the bucket will be
-- full again (a decimal integer, as GCRA's TAT: a bucket with level L at
-- time T is full at T + tau − L, so level = tau − (full − now)), and
-- expires then; a full bucket is deleted. A value "LEVEL LAST" (level in
-- nanoseconds of refill measured at Unix-ns LAST), written by an older
-- sluice, is read too. Reply: allowed, level.
ALGOS[2] = {
  load = function(k, q)
    local v = redis.call('GET', k)
    if not v then return q.tau end
    local i = string.find(v, ' ', 1, true)
    local level
    if i then
      local since = -rel(string.sub(v, i + 1))
      if since < 0 then since = 0 end
      level = tonumber(string.sub(v, 1, i - 1)) + since
    else
      level = q.tau - rel(v)
    end
    if level > q.tau then level = q.tau end
    if level < q.tau - MAXAHEAD then level = q.tau - MAXAHEAD end
    return level
  end,
  step = function(level, op, q)
    if op <= 2 then
      if level < q.inc then return 0, level, 0, 0 end
      if op == 2 then return 1, level, 0, 0 end
      level = level - q.chg
    elseif op == 3 then
      -- q.inc < 0: the refund of a reservation (see gcra.lua)
      local back = q.chg
      if q.inc < 0 and q.tau - level + q.inc > 0 then
        back = back - (q.tau - level + q.inc)
        if back < 0 then back = 0 end
      end
      level = level + back
      if level > q.tau then level = q.tau end
    else
      level = level - q.chg
      if level < q.tau - MAXAHEAD then level = q.tau - MAXAHEAD end
    end
    return 1, level, 0, 0, level
  end,
  save = function(k, level, q)
    if level >= q.tau then
      redis.call('DEL', k)
    else
      redis.call('SET', k, abs(q.tau - level), 'PX', ms(q.tau - level))
    end
  end,
}
