-- Fixed window in per-window keys (Options.PlainWindows), for batches: the
-- key is a base name and the count of the window starting at START is the
-- plain integer in key..':'..START (see fixedwindow_plain.lua), whose TTL
-- runs past the window's end by the ms in the lease slot (a fixed window
-- has no lease). Reply: allowed, count, elapsed.
ALGOS[7] = {
  prep = function(q)
    q.e = elapsed(q.p, q.ps)
    return true
  end,
  load = function(k, q)
    local c = tonumber(redis.call('GET', k .. ':' .. abs(-q.e)) or '0')
    if c < 0 then return 0 end
    return c
  end,
  step = ALGOS[5].step, -- fixedwindow.lua precedes this file
  save = function(k, c, q)
    local w = k .. ':' .. abs(-q.e)
    if c == 0 then
      redis.call('DEL', w)
    else
      redis.call('SET', w, fmt(c), 'PX', ms(q.p - q.e) + tonumber(q.lease))
    end
  end,
}
