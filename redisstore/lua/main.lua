-- The body of every script: apply ARGV[1] to each key, all or nothing.
--
-- KEYS are the keys; ARGV[4...] holds 10 values per key: algorithm, period,
-- period in whole seconds (0 if not whole), rate, tau (the burst's refill
-- time), interval of the effective cost, interval of the cost, effective
-- cost (at least 1), cost, lease id. Durations are in nanoseconds. The
-- sliding window log has no tau: its tau slot carries the limit's
-- granularity in whole milliseconds (0 for an exact log), read as q.g,
-- and its interval slot a refund's Request.AdmittedAgo in nanoseconds (0
-- refunds the newest units), kept as the decimal string q.age.
--
-- The reply holds 4 numbers per key: allowed (1 or 0) and three that
-- depend on the algorithm, from which the client computes the Decision
-- exactly. With OpRefund, keys are refunded only if every lease in the
-- batch is held. With OpAllow, keys are charged only if every key allows; a
-- denied batch reports, for the keys that would have allowed, their state
-- as it stands. A key repeated in the batch sees its earlier charges.
local op = tonumber(ARGV[1])
local n = #KEYS
local qs, cur, orig, lastq, order = {}, {}, {}, {}, {}
local res = {}
local all = true
for i = 1, n do
  local b = 3 + (i - 1) * 10
  local id = tonumber(ARGV[b + 1])
  local A = ALGOS[id]
  if not A then return redis.error_reply('ERR sluice: algorithm ' .. tostring(ARGV[b + 1]) .. ' not in this script') end
  local q = {
    a = A, p = tonumber(ARGV[b + 2]), ps = tonumber(ARGV[b + 3]), rate = tonumber(ARGV[b + 4]),
    tau = tonumber(ARGV[b + 5]), inc = tonumber(ARGV[b + 6]), chg = tonumber(ARGV[b + 7]),
    eff = tonumber(ARGV[b + 8]), cost = math.min(tonumber(ARGV[b + 9]), MAXCOUNT), lease = ARGV[b + 10],
  }
  if id == 4 or id == 5 then q.e = elapsed(q.p, q.ps) end
  if id == 3 then q.g, q.tau, q.age = q.tau, 0, ARGV[b + 6] end
  -- A calendar window outside Redis's time: nothing is written yet.
  if A.prep and not A.prep(q) then return { -2, NS, NN } end
  qs[i] = q
  local k = KEYS[i]
  local st = cur[k]
  if st == nil then
    st = A.load(k, q)
    orig[k] = st
    order[#order + 1] = k
  end
  local ok, x, y, z, nst = A.step(st, op, q)
  if nst ~= nil then
    cur[k] = nst
    lastq[k] = q
  else
    cur[k] = st
  end
  if ok == 0 then all = false end
  res[#res + 1] = ok
  res[#res + 1] = x
  res[#res + 1] = y
  res[#res + 1] = z
end
if op == 1 and not all then
  for i = 1, n do
    if res[(i - 1) * 4 + 1] == 1 then
      local q = qs[i]
      local _, x, y, z = q.a.step(orig[KEYS[i]], 2, q)
      res[(i - 1) * 4 + 2] = x
      res[(i - 1) * 4 + 3] = y
      res[(i - 1) * 4 + 4] = z
    end
  end
  return res
end
-- A refund batch with a lease that is not held refunds nothing.
if op ~= 2 and not (op == 3 and not all) then
  for _, k in ipairs(order) do
    local q = lastq[k]
    if q then q.a.save(k, cur[k], q) end
  end
end
return res
