-- KEYS[1] share; ARGV: now (or ''), idle ms, all (1 or 0).
-- Takes back a bucket share's units to refund at home: all of them when
-- all is 1, else only when the share expired or went unspent for idle ms.
-- Reply: the units taken (0 when none).
local now = now_ms()
local idle, all = tonumber(ARGV[2]), ARGV[3] == '1'
local n, exp, win, last = load(KEYS[1])
if n <= 0 or win ~= '' then return 0 end
if not all and exp > now and now - last < idle then return 0 end
redis.call('HSET', KEYS[1], 'n', 0)
return n
