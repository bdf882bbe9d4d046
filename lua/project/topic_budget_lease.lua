#!lua
-- project_topic_budget_lease: one instance's lease on the module budget, so
-- that most publishes need no module call of their own. In one call it
-- returns the caller's previous lease (if any) and takes the next one:
--   return: the lease's entry is dropped (leased - its amount), the bytes
--           the instance's project scripts added under it are committed
--           (and counted in rpos while a reconcile scans), the bytes they
--           released are subtracted when no reconcile started or finished
--           since the lease was taken (gen unchanged; else they stay
--           counted until the next reconcile, which only over-counts). A
--           lease the reconcile already dropped (it expired) still commits
--           its added bytes: counting them twice only over-counts.
--   take:   a lease of `amount` bytes is granted only when the module keeps
--           `keep` bytes free after it (near the cap every write reserves
--           exactly); otherwise, when `exact` > 0, an exact reservation of
--           that many bytes (as project_topic_budget_reserve) is made.
-- The lease lives `ttl` ms; the instance stops using it well before, and
-- the reconcile drops an expired one (its instance died or went idle). Used
-- bytes of an unreturned lease stay inside `leased`, so the module counter
-- never under-counts. Not allow-oom: under OOM a publish leaves the module
-- untouched like every other write; a lease it could not return stays
-- counted until the reconcile drops it, which only over-counts.
-- KEYS[1] budget    han:prj:{<env>:module}:budget    HASH committed, reserved, leased, gen, rstart, rpos
-- KEYS[2] resv      han:prj:{<env>:module}:resv      HASH reservation id -> "<amount>:<created ms>"
-- KEYS[3] leases    han:prj:{<env>:module}:leases    HASH lease id -> "<amount>:<expires ms>"
-- KEYS[4] projects  han:prj:{<env>:module}:projects  SET project ids holding reliable bytes (for reconcile)
-- KEYS[5] seen      han:prj:{<env>:module}:seen      HASH project id -> ms of the last call that named it
-- ARGV[1] id of the lease returned, '' for none
-- ARGV[2] bytes the project scripts added under it (>= 0)
-- ARGV[3] bytes they released under it (>= 0)
-- ARGV[4] gen returned when it was taken
-- ARGV[5] id of the new lease or reservation, '' to only return
-- ARGV[6] lease amount in bytes (> 0)
-- ARGV[7] lease lifetime in ms
-- ARGV[8] module budget (cap) in bytes
-- ARGV[9] bytes no lease may take: the last part of the cap is reserved exactly
-- ARGV[10] exact reservation to make when no lease is granted (0: none)
-- ARGV[11] project id of the write that asks
-- ARGV[12..] project ids the new lease may also draw for (those the
--          instance drew for on its previous lease), used only when a
--          lease is granted
-- Every project id the call grants bytes for (the asker's, and with a
-- lease the others) is added to the projects SET and stamped with the
-- time of the call: the instance draws for a project only on a lease
-- whose call named it, and for 5 s at most, so the reconcile, which drops
-- ids whose stamp is old and whose budget it read empty, never drops one
-- a write may still fill.
-- Returns {outcome, gen, committed, reserved, leased}: outcome 2 = lease
-- granted, 1 = exact reservation made, 0 = neither.
-- Structure: every key the call writes is read first (the budget with
-- HMGET, a returned lease's entry with HGET) or, when only written,
-- checked with TYPE, all before the first write, so a key of the wrong
-- type fails (WRONGTYPE, which the caller maps to data_state_invalid) or
-- is refused with nothing written.
-- Numbers go to Redis as integer text (string.format), not through Lua's
-- floating-point formatting.
-- Errors: "ERR data_state_invalid" (nothing written).
--#include count
local function decimal(n)
  return string.format('%d', n)
end
local function writable(key, want)
  local t = redis.call('TYPE', key)['ok']
  return t == 'none' or t == want
end

-- Reads and checks.
local b = redis.call('HMGET', KEYS[1], 'committed', 'reserved', 'leased', 'gen', 'rstart')
for i = 1, 5 do
  if not storedCount(b[i]) then
    return redis.error_reply('ERR data_state_invalid')
  end
end
local committed, reserved, leased = tonumber(b[1] or '0'), tonumber(b[2] or '0'), tonumber(b[3] or '0')
local gen, rstart = tonumber(b[4] or '0'), tonumber(b[5] or '0')
if not (committed and reserved and leased and gen and rstart) or committed < 0 or reserved < 0 or leased < 0 then
  return redis.error_reply('ERR data_state_invalid')
end

local returned, add = nil, 0
if ARGV[1] ~= '' then
  returned = redis.call('HGET', KEYS[3], ARGV[1])
  if returned then
    leased = leased - (tonumber(string.match(returned, '^(%d+):')) or 0)
    if leased < 0 then
      leased = 0
    end
  end
  local release
  add, release = tonumber(ARGV[2]), tonumber(ARGV[3])
  committed = committed + add
  if release > 0 and gen == tonumber(ARGV[4]) then
    committed = committed - release
  end
  if committed < 0 then
    committed = 0
  end
end

local outcome, now, amount, exact = 0, 0, 0, 0
if ARGV[5] ~= '' then
  local cap = tonumber(ARGV[8])
  amount, exact = tonumber(ARGV[6]), tonumber(ARGV[10])
  if committed + reserved + leased + amount <= cap - tonumber(ARGV[9]) then
    outcome = 2
  elseif exact > 0 and committed + reserved + leased + exact <= cap then
    outcome = 1
  end
end
if outcome > 0 then
  if outcome == 2 and ARGV[1] == '' and not writable(KEYS[3], 'hash') then
    return redis.error_reply('ERR data_state_invalid')
  end
  if outcome == 1 and not writable(KEYS[2], 'hash') then
    return redis.error_reply('ERR data_state_invalid')
  end
  if not (writable(KEYS[4], 'set') and writable(KEYS[5], 'hash')) then
    return redis.error_reply('ERR data_state_invalid')
  end
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Writes.
if returned then
  redis.call('HDEL', KEYS[3], ARGV[1])
end
if add > 0 and rstart > 0 then
  redis.call('HINCRBY', KEYS[1], 'rpos', ARGV[2])
end
if outcome == 2 then
  redis.call('HSET', KEYS[3], ARGV[5], ARGV[6] .. ':' .. decimal(now + tonumber(ARGV[7])))
  leased = leased + amount
elseif outcome == 1 then
  redis.call('HSET', KEYS[2], ARGV[5], ARGV[10] .. ':' .. decimal(now))
  reserved = reserved + exact
end
if outcome > 0 then
  local last = outcome == 2 and #ARGV or 11
  local stamp = decimal(now)
  for i = 11, last do
    redis.call('SADD', KEYS[4], ARGV[i])
    redis.call('HSET', KEYS[5], ARGV[i], stamp)
  end
end
redis.call('HSET', KEYS[1], 'committed', decimal(committed), 'reserved', decimal(reserved), 'leased', decimal(leased))
return {outcome, gen, committed, reserved, leased}
