-- KEYS[1] share; ARGV: now (or ''), idle ms, all (1 or 0), keep.
-- Takes back a bucket share's units to refund at home: all of them when
-- all is 1, or the share expired, or went unspent for idle ms; else those
-- above keep (a share larger than the region's demand needs, after the
-- demand moved elsewhere), when keep is not negative. Reply: the units
-- taken (0 when none).
local now = now_ms()
local idle, all, keep = tonumber(ARGV[2]), ARGV[3] == '1', tonumber(ARGV[4])
local n, exp, win, last = load(KEYS[1])
if n <= 0 or win ~= '' then return 0 end
local take = n
if not all and exp > now and now - last < idle then
  if keep < 0 or n <= keep then return 0 end
  take = n - keep
end
redis.call('HSET', KEYS[1], 'n', n - take)
return take
