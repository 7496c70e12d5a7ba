-- KEYS[1] a global key's epoch marker at its home; ARGV: a new random id,
-- the id the asking region last saw ('' when none), ttl ms, grace ms.
-- The marker names the life of the key's state at home: it lives as long
-- as the state may matter, and goes with it when the home loses its data
-- (a restart without persistence, a flush, an empty replica). A region that remembers an
-- id and finds no marker learns that the home forgot: the marker is set
-- again, flagged 'id:q:<ms>' until the asker has charged the key's
-- capacity (quarantine) and cleared the flag; a flag older than grace (the
-- charge failed) makes the next asker charge. Reply: {the current id, 1
-- when the capacity is to be charged by the asker, else 0}.
local cur = redis.call('GET', KEYS[1])
local ttl, grace = tonumber(ARGV[3]), tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if cur then
  redis.call('PEXPIRE', KEYS[1], ttl)
  local id, at = string.match(cur, '^(.*):q:(%d+)$')
  if not id then return {cur, 0} end
  if now - tonumber(at) < grace then return {id, 0} end
  redis.call('SET', KEYS[1], id .. ':q:' .. now, 'PX', ttl)
  return {id, 1}
end
if ARGV[2] ~= '' then
  redis.call('SET', KEYS[1], ARGV[1] .. ':q:' .. now, 'PX', ttl)
  return {ARGV[1], 1}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl)
return {ARGV[1], 0}
