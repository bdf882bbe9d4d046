#!lua
-- project_topic_budget_reserve: phase one of a write that adds reliable bytes:
-- reserve `amount` on the module-wide budget (64 MiB across projects), a capped
-- increment that never lets committed + reserved + leased pass the cap
-- (leased: what instances hold as leases, project_topic_budget_lease). The project
-- script runs next; phase two (project_topic_budget_settle) turns the
-- reservation into committed bytes or refunds it. A reservation never settled
-- (the instance died) is dropped by the reconcile job. The keys sit under their
-- own hash tag {<env>:module}, outside every project's slot. A granted
-- reservation adds the project to the projects SET and stamps it in the
-- same call, so the reconcile, which drops ids whose stamp is old and
-- whose budget it read empty, never drops one a write may still fill.
-- KEYS[1] budget    han:prj:{<env>:module}:budget    HASH committed, reserved, leased, gen, rstart, rpos
-- KEYS[2] resv      han:prj:{<env>:module}:resv      HASH reservation id -> "<amount>:<created ms>"
-- KEYS[3] projects  han:prj:{<env>:module}:projects  SET project ids holding reliable bytes (for reconcile)
-- KEYS[4] seen      han:prj:{<env>:module}:seen      HASH project id -> ms of the last call that named it
-- ARGV[1] reservation id (random)
-- ARGV[2] amount in bytes (> 0)
-- ARGV[3] module budget (cap) in bytes
-- ARGV[4] project id
-- Returns {granted (1 | 0), gen, committed, reserved}.
-- Errors: "ERR data_state_invalid" (nothing written).
--#include key_types
--#include count
if not keyTypesMatch({'hash', 'hash', 'set', 'hash'}) then
  return redis.error_reply('ERR data_state_invalid')
end
local b = redis.call('HMGET', KEYS[1], 'committed', 'reserved', 'gen', 'leased')
for i = 1, 4 do
  if not storedCount(b[i]) then
    return redis.error_reply('ERR data_state_invalid')
  end
end
local committed, reserved, gen = tonumber(b[1] or '0'), tonumber(b[2] or '0'), tonumber(b[3] or '0')
local leased = tonumber(b[4] or '0')
if not (committed and reserved and gen and leased) or committed < 0 or reserved < 0 or leased < 0 then
  return redis.error_reply('ERR data_state_invalid')
end
local amount = tonumber(ARGV[2])
if committed + reserved + leased + amount > tonumber(ARGV[3]) then
  return {0, gen, committed, reserved}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[2], ARGV[1], amount .. ':' .. now)
redis.call('HINCRBY', KEYS[1], 'reserved', amount)
redis.call('SADD', KEYS[3], ARGV[4])
redis.call('HSET', KEYS[4], ARGV[4], string.format('%d', now))
return {1, gen, committed, reserved + amount}
