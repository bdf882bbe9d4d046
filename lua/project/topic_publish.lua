#!lua
-- project_topic_publish: publish one message to a topic.
-- Idempotent per identity (topic, producerId, clientEventId) within the
-- dedupe window: the same canonical payload returns the stored message, a
-- different one is a conflict. Every subscription existing now gets a
-- pending receipt, and its reservation is charged now, so a claim never
-- fails on budget. Reads and checks come first, then the writes: the purge
-- of expired dedupe records (they are gone whatever the outcome), reported
-- in `purged` on every path after the checks, and for a new message the
-- message, its receipts, its dedupe record and the counters.
-- Structure: the first access of every key is a read, or for the stream
-- the XADD that is the first write, so a key of the wrong type fails that
-- command (WRONGTYPE, which the caller maps to data_state_invalid) before
-- anything is written; the open or done key and each receipts key, which
-- are otherwise only written, are checked with TYPE before the first write.
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
-- Errors: "ERR data_state_invalid" and WRONGTYPE (nothing written).
--#include topic_budget
--#include dedupe_expired
--#include dedupe_purge
--#include same_subscriptions
--#include clock
local n = tonumber(ARGV[14])
local tid = ARGV[1]
local msg, rcpt, dd, tb = topicBudget(KEYS[2], tid)
if not msg then
  return redis.error_reply('ERR data_state_invalid')
end
if redis.call('HEXISTS', KEYS[1], tid) == 0 then
  if redis.call('EXISTS', KEYS[5], KEYS[6], KEYS[7], KEYS[8]) > 0 then
    return redis.error_reply('ERR data_state_invalid')
  end
  return {'topic_not_found', '', 0, 0, 0}
end
-- Every message holds at least 2 bytes, so messages without counted bytes
-- (the budget missing or emptied) are data the script did not write.
if msg == 0 and redis.call('XLEN', KEYS[5]) > 0 then
  return redis.error_reply('ERR data_state_invalid')
end
if not sameSubscriptions(KEYS[6], n, 14) then
  return {'retry', '', 0, 0, 0}
end

local now, nowText = clockNow()
local expired, purged = dedupeExpired(KEYS[3], KEYS[4], nowText, ARGV[13], dd)
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
local size, ddBytes, per = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[11])
local need = size + ddBytes + n * per
local outcome
if live then
  outcome = live.f == ARGV[3] and 'replay' or 'conflict'
elseif msg + rcpt + dd - purged + need > tonumber(ARGV[10]) then
  outcome = 'budget'
elseif need > tonumber(ARGV[9]) then
  outcome = 'module'
end
if outcome then
  -- The only writes: the purge.
  dedupePurge(KEYS[3], KEYS[4], expired)
  if purged > 0 then
    redis.call('HINCRBY', KEYS[2], 'dd', -purged)
  end
  if outcome == 'replay' then
    return {'replay', live.m, live.a, 0, purged}
  end
  return {outcome, '', 0, 0, purged}
end

-- A new message. The keys only written below are checked first.
local want = n > 0 and {KEYS[7], 'hash'} or {KEYS[8], 'zset'}
local kt = redis.call('TYPE', want[1])['ok']
if kt ~= 'none' and kt ~= want[2] then
  return redis.error_reply('ERR data_state_invalid')
end
for i = 1, n do
  kt = redis.call('TYPE', KEYS[8 + i])['ok']
  if kt ~= 'none' and kt ~= 'hash' then
    return redis.error_reply('ERR data_state_invalid')
  end
end
-- The first write: on a stream key of another type it fails, writing nothing.
-- Numbers go to Redis and into records as text (clockNow); the ARGV ones
-- as the caller sent them.
local id = redis.call('XADD', KEYS[5], '*', 'p', ARGV[4], 'c', ARGV[5], 'd', ARGV[6], 'z', ARGV[7], 'a', nowText)
dedupePurge(KEYS[3], KEYS[4], expired)
local pending = '{"s":"pending","a":0,"l":0,"u":' .. nowText .. ',"h":""}'
for i = 1, n do
  redis.call('HSET', KEYS[8 + i], id, pending)
end
if n > 0 then
  redis.call('HSET', KEYS[7], id, ARGV[14])
else
  redis.call('ZADD', KEYS[8], nowText, id)
end
local x = decimal(now + tonumber(ARGV[12]))
-- The record is built as text: every value is a number, the stream id or
-- the hex fingerprint, none of which needs escaping in JSON.
redis.call('HSET', KEYS[3], ARGV[2], '{"m":"' .. id .. '","f":"' .. ARGV[3] .. '","a":' .. nowText .. ',"z":' .. ARGV[7] ..
  ',"b":' .. ARGV[8] .. ',"x":' .. x .. '}')
redis.call('ZADD', KEYS[4], x, ARGV[2])
redis.call('HSET', KEYS[2], 'msg', decimal(msg + size), 'tb:' .. tid, decimal(tb + size), 'rcpt', decimal(rcpt + n * per),
  'dd', decimal(dd - purged + ddBytes))
return {'created', id, now, need, purged}
