-- Reset with per-window keys (Options.PlainWindows), after lib.lua: deletes
-- every key in KEYS and, for each KEYS[i] whose period ARGV[2 + 2i] (ns)
-- is not 0, the key of its current fixed window, KEYS[i]..':'..START, by
-- lib.lua's time. ARGV[3 + 2i] is the period in whole seconds (0 if not
-- whole). Reply: 1.
for i = 1, #KEYS do
  local k = KEYS[i]
  local p = tonumber(ARGV[2 + 2 * i])
  redis.call('DEL', k)
  if p > 0 then
    redis.call('DEL', k .. ':' .. abs(-elapsed(p, tonumber(ARGV[3 + 2 * i]))))
  end
end
return 1
