-- KEYS[1] share; ARGV: now (or ''), units, exp (ms, this Redis's clock;
-- 0 to put units back without extending the share), win, gc ms.
-- Adds units charged at home, spendable until exp. A share of a window
-- (win not '') replaces one of another window: those units belong to a
-- window that has ended. A credit whose exp has passed is refused (its
-- units are the caller's to refund). Reply: {applied, n after, ms until
-- the share expires}.
local now = now_ms()
local units, until_, win, gc = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
if until_ > 0 and until_ <= now then return {0, 0, 0} end
local n, exp, w, last = load(KEYS[1])
if win ~= w then
  n = 0
  exp = 0
end
n = n + units
if until_ > exp then exp = until_ end
redis.call('HSET', KEYS[1], 'n', n, 'exp', exp, 'win', win, 'last', now)
redis.call('PEXPIRE', KEYS[1], math.max(exp - now, 0) + gc)
return {1, n, math.max(exp - now, 0)}
