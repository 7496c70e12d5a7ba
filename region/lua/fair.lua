-- KEYS[1] a global key's demand table at its home; ARGV: now (or ''), op,
-- instance id, region, demand (units/s), units, rate (units/s), capacity
-- (units a region's pool may hold, all regions together), fresh ms, max
-- instances, gc ms, allot every ms, short (1 when the caller's last
-- charge at home, or this allotment, found the store short of what it
-- asked: the store is spent; 0 when not; an allotment of the whole
-- capacity says the store was full), home (1 when the caller is in the
-- key's home region).
-- Each instance reports its demand on the key with every fetch, and the
-- home region's every 100ms: field 'd:<instance>' = '<region> <demand>
-- <ms>'. A report older than fresh ms is dropped, and at most max
-- instances are counted (a new one past them is not). The key is at its
-- limit while the regions' demand together exceeds the rate and the
-- store was last seen short less than fresh ms ago ('t:short'); then the
-- home region charges what its store holds and allots it here to the
-- regions' pools ('p:<region>' = units charged at home, not fetched yet)
-- in proportion to their demand, each pool up to capacity × its part.
-- op 'ask' (units: asked): reports the demand and takes up to units from
-- the region's pool. op 'allot' (units: charged at home): allots them.
-- A pool whose region has no fresh demand is freed. Reply: {units
-- granted (ask) or allotted (allot), 1 when the key is at its limit, the
-- demand of all regions (units/s, rounded down), ms until the pool may
-- hold the ask (ask, when short), units freed: charged at home and to be
-- refunded there by the caller, 1 when the caller is to allot now}.
local now = now_ms()
local op, inst, reg = ARGV[2], ARGV[3], ARGV[4]
local dem, units, rate, cap = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local fresh, maxn, gc, every = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
local short, home = ARGV[13] == '1', ARGV[14] == '1'
local shortAt = nil
local me = 'd:' .. inst
local h = redis.call('HGETALL', KEYS[1])
local byreg, pool = {}, {}
local total, count, known, allotted = 0, 0, false, 0
local tabrid = nil
for i = 1, #h, 2 do
  local f, v = h[i], h[i + 1]
  local kind = string.sub(f, 1, 2)
  if kind == 'd:' then
    local r, d, ts = string.match(v, '^(%S+) (%S+) (%S+)$')
    d, ts = tonumber(d), tonumber(ts)
    if f == me and op == 'ask' then
      known = true
    elseif not d or not ts or now - ts > fresh then
      redis.call('HDEL', KEYS[1], f)
    else
      byreg[r] = (byreg[r] or 0) + d
      total = total + d
      count = count + 1
    end
  elseif kind == 'p:' then
    pool[string.sub(f, 3)] = tonumber(v) or 0
  elseif f == 't:allot' then
    allotted = tonumber(v) or 0
  elseif f == 't:short' then
    shortAt = tonumber(v)
  elseif f == 't:rid' then
    tabrid = v
  end
end
-- The pools are units charged at the home in the history of writes the
-- table was written in (the server's replication id, as epoch.lua reads
-- it). A table from another history (a failover to a replica, which may
-- lag; a restart from files) may hold units since fetched, and the key's
-- epoch check charges the key's capacity there (quarantine): its pools
-- are dropped, not refunded. A user the ACL denies INFO reads ''.
local info = redis.pcall('INFO', 'replication')
local rid = type(info) == 'string' and string.match(info, 'master_replid:(%w+)') or ''
if rid ~= '' and tabrid ~= rid then
  if tabrid then
    for r in pairs(pool) do redis.call('HDEL', KEYS[1], 'p:' .. r) end
    pool = {}
  end
  redis.call('HSET', KEYS[1], 't:rid', rid)
end
if op == 'ask' and (known or count < maxn) then
  redis.call('HSET', KEYS[1], me, reg .. ' ' .. dem .. ' ' .. now)
  byreg[reg] = (byreg[reg] or 0) + dem
  total = total + dem
end
local freed = 0
for r, p in pairs(pool) do
  if not byreg[r] then
    freed = freed + p
    pool[r] = nil
    redis.call('HDEL', KEYS[1], 'p:' .. r)
  end
end
if short then
  shortAt = now
  redis.call('HSET', KEYS[1], 't:short', now)
elseif op == 'allot' then
  -- The store held all of its capacity: the key is not at its limit.
  shortAt = nil
  redis.call('HDEL', KEYS[1], 't:short')
end
redis.call('PEXPIRE', KEYS[1], gc)
local sat = 0
if total > rate and shortAt and now - shortAt <= fresh then sat = 1 end
if op == 'allot' then
  local left = units
  -- In proportion to the demand, each pool up to its cap; what a full
  -- pool would not take goes to the others (a few passes).
  for pass = 1, 4 do
    if left < 1e-9 then break end
    local open = 0
    for r, d in pairs(byreg) do
      if (pool[r] or 0) < cap * d / total then open = open + d end
    end
    if open <= 0 then break end
    local given = 0
    for r, d in pairs(byreg) do
      local p, top = pool[r] or 0, cap * d / total
      if p < top then
        local add = math.min(left * d / open, top - p)
        pool[r] = p + add
        given = given + add
      end
    end
    left = left - given
  end
  for r, p in pairs(pool) do redis.call('HSET', KEYS[1], 'p:' .. r, p) end
  -- Sums of fractions: left may end a rounding error under 0.
  if left < 0 then left = 0 end
  freed = freed + left
  return {units - math.floor(left), sat, math.floor(total), 0, math.floor(freed), 0}
end
if op ~= 'ask' then return redis.error_reply('region: unknown op') end
local p = pool[reg] or 0
local grant = math.min(units, math.floor(p))
if grant > 0 then redis.call('HSET', KEYS[1], 'p:' .. reg, p - grant) end
local wait = 0
if grant < units and sat == 1 then
  local pace = rate * (byreg[reg] or 0) / total
  wait = fresh
  if pace > 0 then wait = math.ceil((units - (p - grant)) * 1000 / pace) end
  -- Pools fill every 'every' ms: a region with a small part asks again
  -- within a few allotments for what its pool holds by then.
  wait = math.min(wait, 4 * every)
end
local due = 0
local after = every
if not home then after = 4 * every end
if sat == 1 and now - allotted >= after then
  due = 1
  redis.call('HSET', KEYS[1], 't:allot', now)
end
return {grant, sat, math.floor(total), wait, math.floor(freed), due}
