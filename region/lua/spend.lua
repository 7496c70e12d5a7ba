-- KEYS[1] share; ARGV: now (or ''), op, cost, gc ms.
-- op: 'allow' spends cost if the live share holds it; 'peek' reports;
-- 'refund' gives cost back to a live share; 'charge' takes cost even into
-- a debt. Reply: {allowed, n after, ms until the share expires}.
local now = now_ms()
local op, cost, gc = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local n, exp, win, last = load(KEYS[1])
local live = exp > now
local ttl = 0
if live then ttl = exp - now end
if op == 'peek' then
  if live and n >= cost then return {1, n, ttl} end
  return {0, n, ttl}
end
if op == 'allow' then
  if not live or n < cost then return {0, n, ttl} end
  n = n - cost
elseif op == 'refund' then
  if not live then return {0, n, ttl} end
  n = n + cost
elseif op == 'charge' then
  n = n - cost
else
  return redis.error_reply('region: unknown op')
end
redis.call('HSET', KEYS[1], 'n', n, 'last', now)
if redis.call('PTTL', KEYS[1]) < 0 then redis.call('PEXPIRE', KEYS[1], ttl + gc) end
return {1, n, ttl}
