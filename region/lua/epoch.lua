-- KEYS[1] a key's epoch marker at the store that holds the key's state
-- (an exact key's home; an asynchronous key's own region); ARGV: a new
-- random id, the id the asker last saw ('' when none), ttl ms, grace ms,
-- '1' to trust a changed rid (TrustHistory: adopt it, no quarantine).
-- The marker names the life of the key's state there, and is lost with it.
-- It reads 'id@rid', rid the server's replication id (INFO replication's
-- master_replid) when the marker was set: the id of the history of writes
-- the server is the master of. A server that restarts without its data
-- (a restart without persistence, a flush, an empty replica) loses the
-- marker; one whose history changed since the marker was set (promoted
-- from a replica, which may lag: a failover; or restarted from its files,
-- which may miss the last writes) holds it with another rid. Either way
-- the charges made since may be lost: the marker is set again, flagged
-- 'id@rid:q:<ms>' until the asker has charged the key's capacity
-- (quarantine) and cleared the flag; a flag older than grace (the charge
-- failed) makes the next asker charge. A lost marker is caught only by an
-- asker that remembers an id; a changed rid by the first asker. Reply:
-- {the current id, 1 when the capacity is to be charged by the asker, else
-- 0, the marker's value to clear the flag with, 1 when rid is known}.
local cur = redis.call('GET', KEYS[1])
local ttl, grace = tonumber(ARGV[3]), tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- A user the ACL denies INFO gets '' (and 0 in the reply's fourth value):
-- the marker then catches a lost state only, not a failover.
local info = redis.pcall('INFO', 'replication')
local rid = type(info) == 'string' and string.match(info, 'master_replid:(%w+)') or ''
local known = rid ~= '' and 1 or 0
if cur then
  redis.call('PEXPIRE', KEYS[1], ttl)
  local body, at = string.match(cur, '^(.*):q:(%d+)$')
  if not body then body = cur end
  local id, mrid = string.match(body, '^(.*)@(%w*)$')
  if not id then
    -- A marker set before it carried the rid: adopt this server's.
    id, mrid = body, rid
    if not at then redis.call('SET', KEYS[1], id .. '@' .. rid, 'PX', ttl) end
  end
  local clear = id .. '@' .. rid
  if mrid ~= rid and not at and ARGV[5] == '1' then
    redis.call('SET', KEYS[1], clear, 'PX', ttl)
    mrid = rid
  end
  if mrid == rid and (not at or now - tonumber(at) < grace) then
    return {id, 0, clear, known}
  end
  redis.call('SET', KEYS[1], clear .. ':q:' .. now, 'PX', ttl)
  return {id, 1, clear, known}
end
local clear = ARGV[1] .. '@' .. rid
if ARGV[2] ~= '' then
  redis.call('SET', KEYS[1], clear .. ':q:' .. now, 'PX', ttl)
  return {ARGV[1], 1, clear, known}
end
redis.call('SET', KEYS[1], clear, 'PX', ttl)
return {ARGV[1], 0, clear, known}
