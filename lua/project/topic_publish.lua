#!lua
-- project_topic_publish: publish one message to a topic.
-- Idempotent per identity (topic, producerId, clientEventId) within the
-- dedupe window: the same canonical payload returns the stored message, a
-- different one is a conflict. Every subscription existing now gets a
-- pending receipt, and its reservation is charged now, so a claim never
-- fails on budget. Reads and checks come first; the only write before the
-- outcome is known is the purge of expired dedupe records (they are gone
-- whatever happens), reported in `purged` on every path after the checks.
-- KEYS[1] topics   han:prj:{<env>:<pid>}:q:topics     HASH topicId -> topic JSON
-- KEYS[2] budget   han:prj:{<env>:<pid>}:q:budget     HASH msg, rcpt, dd (reliable bytes), tb:<tid> (message bytes of a topic)
-- KEYS[3] dd       han:prj:{<env>:<pid>}:q:dd         HASH identity -> dedupe JSON {m, f, a, z, b, x}
-- KEYS[4] ddx      han:prj:{<env>:<pid>}:q:ddx        ZSET identity -> expiresAt ms
-- KEYS[5] stream   han:prj:{<env>:<pid>}:t:<tid>:s    STREAM messages {p, c, d, z, a}
-- KEYS[6] tsubs    han:prj:{<env>:<pid>}:t:<tid>:subs SET subscription ids
-- KEYS[7] open     han:prj:{<env>:<pid>}:t:<tid>:o    HASH messageId -> receipts not yet terminal
-- KEYS[8] done     han:prj:{<env>:<pid>}:t:<tid>:d    ZSET publishedAt -> messageId terminal for every subscription
-- KEYS[9..] one receipts HASH han:prj:{<env>:<pid>}:s:<sid>:r per subscription, in ARGV[15..] order
-- ARGV[1] topic id
-- ARGV[2] identity: topicId "\n" producerId "\n" clientEventId
-- ARGV[3] fingerprint of the canonical payload (hex SHA-256)
-- ARGV[4] producerId
-- ARGV[5] clientEventId
-- ARGV[6] canonical payload
-- ARGV[7] message bytes (payload bytes)
-- ARGV[8] dedupe record bytes
-- ARGV[9] bytes reserved on the module budget for this call
-- ARGV[10] project budget in bytes
-- ARGV[11] bytes reserved per receipt
-- ARGV[12] dedupe window in ms
-- ARGV[13] how many expired dedupe records to purge at most
-- ARGV[14] number of subscriptions n the caller saw
-- ARGV[15..14+n] their ids
-- Returns {outcome, messageId, publishedAt, added, purged}: outcome is
-- 'created' (added = bytes charged), 'replay' (messageId/publishedAt of the
-- stored message), 'conflict', 'budget' (project budget), 'module' (needs
-- more than reserved), or, with nothing written, 'topic_not_found' and
-- 'retry' (the subscriptions changed).
-- Errors: "ERR data_state_invalid" (nothing written).
--#include key_types
--#include topic_budget
--#include dedupe_expired
--#include dedupe_purge
--#include same_subscriptions
local n = tonumber(ARGV[14])
if not keyTypesMatch({'hash', 'hash', 'hash', 'zset', 'stream', 'set', 'hash', 'zset'}, 8 + n, {'hash'}) then
  return redis.error_reply('ERR data_state_invalid')
end
local tid = ARGV[1]
local msg, rcpt, dd, tb = topicBudget(KEYS[2], tid)
if not msg then
  return redis.error_reply('ERR data_state_invalid')
end
if redis.call('EXISTS', KEYS[2]) == 0 and redis.call('XLEN', KEYS[5]) > 0 then
  return redis.error_reply('ERR data_state_invalid')
end
if redis.call('HEXISTS', KEYS[1], tid) == 0 then
  if redis.call('EXISTS', KEYS[5], KEYS[6], KEYS[7], KEYS[8]) > 0 then
    return redis.error_reply('ERR data_state_invalid')
  end
  return {'topic_not_found', '', 0, 0, 0}
end
if not sameSubscriptions(KEYS[6], n, 14) then
  return {'retry', '', 0, 0, 0}
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expired, purged = dedupeExpired(KEYS[3], KEYS[4], now, tonumber(ARGV[13]), dd)
if not expired then
  return redis.error_reply('ERR data_state_invalid')
end
local live
local raw = redis.call('HGET', KEYS[3], ARGV[2])
if raw then
  local ok, rec = pcall(cjson.decode, raw)
  if not ok or type(rec) ~= 'table' or type(rec.x) ~= 'number' then
    return redis.error_reply('ERR data_state_invalid')
  end
  if rec.x > now then
    live = rec
  end
end

-- Writes from here on: first the purge.
dedupePurge(KEYS[3], KEYS[4], expired)
if purged > 0 then
  redis.call('HINCRBY', KEYS[2], 'dd', -purged)
end
if live then
  if live.f == ARGV[3] then
    return {'replay', live.m, live.a, 0, purged}
  end
  return {'conflict', '', 0, 0, purged}
end
local size, ddBytes, per = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[11])
local need = size + ddBytes + n * per
if msg + rcpt + dd - purged + need > tonumber(ARGV[10]) then
  return {'budget', '', 0, 0, purged}
end
if need > tonumber(ARGV[9]) then
  return {'module', '', 0, 0, purged}
end
local id = redis.call('XADD', KEYS[5], '*', 'p', ARGV[4], 'c', ARGV[5], 'd', ARGV[6], 'z', size, 'a', now)
local pending = cjson.encode({s = 'pending', a = 0, l = 0, u = now, h = ''})
for i = 1, n do
  redis.call('HSET', KEYS[8 + i], id, pending)
end
if n > 0 then
  redis.call('HSET', KEYS[7], id, n)
else
  redis.call('ZADD', KEYS[8], now, id)
end
local x = now + tonumber(ARGV[12])
redis.call('HSET', KEYS[3], ARGV[2], cjson.encode({m = id, f = ARGV[3], a = now, z = size, b = ddBytes, x = x}))
redis.call('ZADD', KEYS[4], x, ARGV[2])
redis.call('HINCRBY', KEYS[2], 'msg', size)
redis.call('HINCRBY', KEYS[2], 'tb:' .. tid, size)
redis.call('HINCRBY', KEYS[2], 'rcpt', n * per)
redis.call('HINCRBY', KEYS[2], 'dd', ddBytes)
return {'created', id, now, need, purged}
