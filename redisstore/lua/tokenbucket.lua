-- Token bucket: the key holds "LEVEL LAST": the level in nanoseconds of
-- refill (a full bucket holds tau) and the Unix-ns time it was measured. It
-- expires when the bucket would be full again; a full bucket is deleted.
-- Reply: allowed, level.
ALGOS[2] = {
  load = function(k, q)
    local v = redis.call('GET', k)
    if not v then return q.tau end
    local i = string.find(v, ' ', 1, true)
    local since = -rel(string.sub(v, i + 1))
    if since < 0 then since = 0 end
    local level = tonumber(string.sub(v, 1, i - 1)) + since
    if level > q.tau then level = q.tau end
    return level
  end,
  step = function(level, op, q)
    if op <= 2 then
      if level < q.inc then return 0, level, 0, 0 end
      if op == 2 then return 1, level, 0, 0 end
      level = level - q.chg
    elseif op == 3 then
      level = level + q.chg
      if level > q.tau then level = q.tau end
    else
      level = level - q.chg
    end
    return 1, level, 0, 0, level
  end,
  save = function(k, level, q)
    if level >= q.tau then
      redis.call('DEL', k)
    else
      redis.call('SET', k, fmt(level) .. ' ' .. abs(0), 'PX', ms(q.tau - level))
    end
  end,
}
