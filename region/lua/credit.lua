-- KEYS[1] share; ARGV: now (or ''), units, ttl ms, win, gc ms.
-- Adds units charged at home, spendable for ttl ms from now. A share of a
-- window (win not '') replaces one of another window: those units belong
-- to a window that has ended. Reply: {n after, ms until expiry}.
local now = now_ms()
local units, ttl, win, gc = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
local n, exp, w, last = load(KEYS[1])
if win ~= w then
  n = 0
  exp = 0
end
n = n + units
if now + ttl > exp then exp = now + ttl end
redis.call('HSET', KEYS[1], 'n', n, 'exp', exp, 'win', win, 'last', now)
redis.call('PEXPIRE', KEYS[1], exp - now + gc)
return {n, exp - now}
