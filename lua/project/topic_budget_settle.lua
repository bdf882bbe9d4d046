#!lua flags=allow-oom
-- project_topic_budget_settle: phase two of the module budget protocol.
-- Drops the reservation (if any), commits the bytes the project script
-- added, and subtracts the bytes it released -- but only when no reconcile
-- started or finished since the caller read `gen` before its project
-- script: a reconcile may already have counted that release, and
-- subtracting it twice could under-count (over-admit). Skipping it only
-- over-counts until the next reconcile. allow-oom: it only moves existing
-- counters, and a refund must get through when the project script was
-- refused for OOM.
-- KEYS[1] budget  han:prj:{<env>:module}:budget  HASH committed, reserved, gen, rstart, rpos
-- KEYS[2] resv    han:prj:{<env>:module}:resv    HASH reservation id -> "<amount>:<created ms>"
-- ARGV[1] reservation id, '' for none
-- ARGV[2] bytes added by the project script (>= 0)
-- ARGV[3] bytes released by the project script (>= 0)
-- ARGV[4] gen read before the project script ran
-- Returns {committed, reserved, released applied (1 | 0)}.
-- Errors: "ERR data_state_invalid" (nothing written).
--#include key_types
--#include count
if not keyTypesMatch({'hash', 'hash'}) then
  return redis.error_reply('ERR data_state_invalid')
end
local b = redis.call('HMGET', KEYS[1], 'committed', 'reserved', 'gen', 'rstart')
for i = 1, 4 do
  if not storedCount(b[i]) then
    return redis.error_reply('ERR data_state_invalid')
  end
end
local committed, reserved = tonumber(b[1] or '0'), tonumber(b[2] or '0')
local gen, rstart = tonumber(b[3] or '0'), tonumber(b[4] or '0')
if not (committed and reserved and gen and rstart) then
  return redis.error_reply('ERR data_state_invalid')
end
local add, release = tonumber(ARGV[2]), tonumber(ARGV[3])
if ARGV[1] ~= '' then
  local r = redis.call('HGET', KEYS[2], ARGV[1])
  if r then
    local amount = tonumber(string.match(r, '^(%d+):')) or 0
    redis.call('HDEL', KEYS[2], ARGV[1])
    reserved = reserved - amount
    if reserved < 0 then
      reserved = 0
    end
  end
end
committed = committed + add
if add > 0 and rstart > 0 then
  redis.call('HINCRBY', KEYS[1], 'rpos', add)
end
local applied = 0
if release > 0 and gen == tonumber(ARGV[4]) then
  committed = committed - release
  applied = 1
end
if committed < 0 then
  committed = 0
end
redis.call('HSET', KEYS[1], 'committed', committed, 'reserved', reserved)
return {committed, reserved, applied}
