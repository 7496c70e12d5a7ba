-- KEYS[1] share; ARGV: now (or ''), op, cost, gc ms, win.
-- op: 'allow' spends cost if the live share holds it; 'peek' reports;
-- 'refund' gives cost back to a live share of window ARGV[5] (any share
-- of a bucket: ''); 'charge' takes cost even into a debt. Reply:
-- {applied, n after, ms until the share expires, the share's window}.
local now = now_ms()
local op, cost, gc = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local n, exp, win, last = load(KEYS[1])
local live = exp > now
local ttl = 0
if live then ttl = exp - now end
if op == 'peek' then
  if live and n >= cost then return {1, n, ttl, win} end
  return {0, n, ttl, win}
end
if op == 'allow' then
  if not live or n < cost then return {0, n, ttl, win} end
  n = n - cost
elseif op == 'refund' then
  if not live or win ~= ARGV[5] then return {0, n, ttl, win} end
  n = n + cost
elseif op == 'charge' then
  n = n - cost
else
  return redis.error_reply('region: unknown op')
end
redis.call('HSET', KEYS[1], 'n', n, 'last', now)
if redis.call('PTTL', KEYS[1]) < 0 then redis.call('PEXPIRE', KEYS[1], ttl + gc) end
return {1, n, ttl, win}
