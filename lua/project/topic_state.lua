#!lua flags=no-writes
-- project_topic_state: what a snapshot shows of topics, subscriptions and
-- the project budget, with the structure checks (read-only: works under
-- OOM). Dedupe records already past their expiry are no longer counted,
-- whether or not a write has purged them yet.
-- KEYS[1] topics  han:prj:{<env>:<pid>}:q:topics  HASH topicId -> topic JSON
-- KEYS[2] subs    han:prj:{<env>:<pid>}:q:subs    HASH subscriptionId -> subscription JSON
-- KEYS[3] budget  han:prj:{<env>:<pid>}:q:budget  HASH msg, rcpt, dd, tb:<tid>
-- KEYS[4] dd      han:prj:{<env>:<pid>}:q:dd      HASH identity -> dedupe JSON
-- KEYS[5] ddx     han:prj:{<env>:<pid>}:q:ddx     ZSET identity -> expiresAt ms
-- ARGV[1] most expired dedupe records to account for
-- Returns {now, messageBytes, receiptBytes, dedupeBytes (live), topics (flat
-- HGETALL), subscriptions (flat HGETALL)}.
-- Errors: "ERR data_state_invalid".
--#include key_types
--#include count
--#include dedupe_expired
if not keyTypesMatch({'hash', 'hash', 'hash', 'hash', 'zset'}) then
  return redis.error_reply('ERR data_state_invalid')
end
local b = redis.call('HMGET', KEYS[3], 'msg', 'rcpt', 'dd')
local msg, rcpt, dd = storedCount(b[1]), storedCount(b[2]), storedCount(b[3])
if not (msg and rcpt and dd) then
  return redis.error_reply('ERR data_state_invalid')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local gone, goneBytes = dedupeExpired(KEYS[4], KEYS[5], now, tonumber(ARGV[1]), dd)
if not gone then
  return redis.error_reply('ERR data_state_invalid')
end
dd = dd - goneBytes
return {now, msg, rcpt, dd, redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[2])}
