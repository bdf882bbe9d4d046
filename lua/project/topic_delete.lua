#!lua
-- project_topic_delete: delete a topic with every message, subscription and
-- receipt of it, and release their budget. The project's dedupe records of
-- the topic stay, counted in the budget, until they expire (24 h), so a
-- retried publish cannot create a second message; expired ones are
-- purged on the way. Reads and checks come first.
-- KEYS[1] topics   han:prj:{<env>:<pid>}:q:topics     HASH topicId -> topic JSON
-- KEYS[2] names    han:prj:{<env>:<pid>}:q:tnames     HASH topic name -> topicId
-- KEYS[3] subs     han:prj:{<env>:<pid>}:q:subs       HASH subscriptionId -> subscription JSON
-- KEYS[4] budget   han:prj:{<env>:<pid>}:q:budget     HASH msg, rcpt, dd, tb:<tid>
-- KEYS[5] dd       han:prj:{<env>:<pid>}:q:dd         HASH identity -> dedupe JSON
-- KEYS[6] ddx      han:prj:{<env>:<pid>}:q:ddx        ZSET identity -> expiresAt ms
-- KEYS[7] stream   han:prj:{<env>:<pid>}:t:<tid>:s    STREAM messages
-- KEYS[8] tsubs    han:prj:{<env>:<pid>}:t:<tid>:subs SET subscription ids
-- KEYS[9] open     han:prj:{<env>:<pid>}:t:<tid>:o    HASH messageId -> receipts not yet terminal
-- KEYS[10] done    han:prj:{<env>:<pid>}:t:<tid>:d    ZSET messages terminal for every subscription
-- KEYS[11..] per subscription (ARGV[5..] order) its receipts HASH …:s:<sid>:r
--            and its leases ZSET …:s:<sid>:l
-- ARGV[1] topic id
-- ARGV[2] bytes reserved per receipt
-- ARGV[3] how many expired dedupe records to purge at most
-- ARGV[4] number of subscriptions n the caller saw
-- ARGV[5..4+n] their ids
-- Returns {'ok', releasedBytes} or, with nothing written,
-- {'topic_not_found'} | {'retry'} (the subscriptions changed).
-- Errors: "ERR data_state_invalid" (nothing written).
--#include key_types
--#include topic_budget
--#include dedupe_expired
--#include dedupe_purge
--#include same_subscriptions
local n = tonumber(ARGV[4])
if not keyTypesMatch({'hash', 'hash', 'hash', 'hash', 'hash', 'zset', 'stream', 'set', 'hash', 'zset'}, 10 + 2 * n, {'hash', 'zset'}) then
  return redis.error_reply('ERR data_state_invalid')
end
local tid = ARGV[1]
local raw = redis.call('HGET', KEYS[1], tid)
if not raw then
  if redis.call('EXISTS', KEYS[7], KEYS[8], KEYS[9], KEYS[10]) > 0 then
    return redis.error_reply('ERR data_state_invalid')
  end
  return {'topic_not_found'}
end
local ok, topic = pcall(cjson.decode, raw)
if not ok or type(topic) ~= 'table' or type(topic.name) ~= 'string' then
  return redis.error_reply('ERR data_state_invalid')
end
if not sameSubscriptions(KEYS[8], n, 4) then
  return {'retry'}
end
local msg, rcpt, dd, tb = topicBudget(KEYS[4], tid)
if not msg then
  return redis.error_reply('ERR data_state_invalid')
end
local receipts = 0
for i = 1, n do
  receipts = receipts + redis.call('HLEN', KEYS[9 + 2 * i])
end
local freedRcpt = receipts * tonumber(ARGV[2])
if freedRcpt > rcpt then
  return redis.error_reply('ERR data_state_invalid')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiredDD, purged = dedupeExpired(KEYS[5], KEYS[6], now, tonumber(ARGV[3]), dd)
if not expiredDD then
  return redis.error_reply('ERR data_state_invalid')
end

-- Writes.
dedupePurge(KEYS[5], KEYS[6], expiredDD)
for i = 1, n do
  redis.call('HDEL', KEYS[3], ARGV[4 + i])
  redis.call('DEL', KEYS[9 + 2 * i], KEYS[10 + 2 * i])
end
redis.call('DEL', KEYS[7], KEYS[8], KEYS[9], KEYS[10])
redis.call('HDEL', KEYS[1], tid)
if redis.call('HGET', KEYS[2], topic.name) == tid then
  redis.call('HDEL', KEYS[2], topic.name)
end
redis.call('HDEL', KEYS[4], 'tb:' .. tid)
if tb > 0 then
  redis.call('HINCRBY', KEYS[4], 'msg', -tb)
end
if freedRcpt > 0 then
  redis.call('HINCRBY', KEYS[4], 'rcpt', -freedRcpt)
end
if purged > 0 then
  redis.call('HINCRBY', KEYS[4], 'dd', -purged)
end
return {'ok', tb + freedRcpt + purged}
