#!lua
-- project_topic_sub_delete: delete a subscription (its consumer state: the
-- delivery position, leases and receipts) and release its receipts' budget.
-- Messages it was the last to hold open become terminal for every
-- subscription (trimmable). Expired dedupe records are purged on the way.
-- Reads and checks come first.
-- KEYS[1] subs      han:prj:{<env>:<pid>}:q:subs       HASH subscriptionId -> subscription JSON
-- KEYS[2] budget    han:prj:{<env>:<pid>}:q:budget     HASH msg, rcpt, dd, tb:<tid>
-- KEYS[3] dd        han:prj:{<env>:<pid>}:q:dd         HASH identity -> dedupe JSON
-- KEYS[4] ddx       han:prj:{<env>:<pid>}:q:ddx        ZSET identity -> expiresAt ms
-- KEYS[5] tsubs     han:prj:{<env>:<pid>}:t:<tid>:subs SET subscription ids of its topic
-- KEYS[6] open      han:prj:{<env>:<pid>}:t:<tid>:o    HASH messageId -> receipts not yet terminal
-- KEYS[7] done      han:prj:{<env>:<pid>}:t:<tid>:d    ZSET messages terminal for every subscription
-- KEYS[8] receipts  han:prj:{<env>:<pid>}:s:<sid>:r    HASH messageId -> receipt JSON
-- KEYS[9] leases    han:prj:{<env>:<pid>}:s:<sid>:l    ZSET leaseUntil ms -> messageId
-- ARGV[1] subscription id
-- ARGV[2] its topic id
-- ARGV[3] bytes reserved per receipt
-- ARGV[4] how many expired dedupe records to purge at most
-- Returns {'ok', releasedBytes} or {'subscription_not_found'} (nothing written).
-- Errors: "ERR data_state_invalid" (nothing written).
--#include key_types
--#include count
--#include subscription
--#include dedupe_expired
--#include dedupe_purge
if not keyTypesMatch({'hash', 'hash', 'hash', 'zset', 'set', 'hash', 'zset', 'hash', 'zset'}) then
  return redis.error_reply('ERR data_state_invalid')
end
local sub = readSubscription(KEYS[1], ARGV[1])
if sub == nil then
  return redis.error_reply('ERR data_state_invalid')
end
if not sub or sub.topicId ~= ARGV[2] then
  return {'subscription_not_found'}
end
local b = redis.call('HMGET', KEYS[2], 'rcpt', 'dd')
local rcpt, dd = storedCount(b[1]), storedCount(b[2])
if not (rcpt and dd) then
  return redis.error_reply('ERR data_state_invalid')
end
local all = redis.call('HGETALL', KEYS[8])
local openIds = {}
for i = 1, #all, 2 do
  local ok2, rec = pcall(cjson.decode, all[i + 1])
  if not ok2 or type(rec) ~= 'table' or type(rec.s) ~= 'string' then
    return redis.error_reply('ERR data_state_invalid')
  end
  if rec.s == 'pending' or rec.s == 'leased' then
    local c = storedCount(redis.call('HGET', KEYS[6], all[i]))
    if c == nil or c < 1 then
      return redis.error_reply('ERR data_state_invalid')
    end
    table.insert(openIds, all[i])
  end
end
local freedRcpt = (#all / 2) * tonumber(ARGV[3])
if freedRcpt > rcpt then
  return redis.error_reply('ERR data_state_invalid')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiredDD, purged = dedupeExpired(KEYS[3], KEYS[4], now, tonumber(ARGV[4]), dd)
if not expiredDD then
  return redis.error_reply('ERR data_state_invalid')
end

-- Writes.
dedupePurge(KEYS[3], KEYS[4], expiredDD)
for _, id in ipairs(openIds) do
  if redis.call('HINCRBY', KEYS[6], id, -1) <= 0 then
    redis.call('HDEL', KEYS[6], id)
    redis.call('ZADD', KEYS[7], now, id)
  end
end
redis.call('DEL', KEYS[8], KEYS[9])
redis.call('SREM', KEYS[5], ARGV[1])
redis.call('HDEL', KEYS[1], ARGV[1])
if freedRcpt > 0 then
  redis.call('HINCRBY', KEYS[2], 'rcpt', -freedRcpt)
end
if purged > 0 then
  redis.call('HINCRBY', KEYS[2], 'dd', -purged)
end
return {'ok', freedRcpt + purged}
