#!lua
-- project_topic_sub_status: set a subscription's status (online | paused).
-- Pausing stops new claims; leases already issued stay valid.
-- KEYS[1] subs  han:prj:{<env>:<pid>}:q:subs  HASH subscriptionId -> subscription JSON
-- ARGV[1] subscription id
-- ARGV[2] status: online | paused
-- Returns {'ok', subscription JSON} | {'subscription_not_found'}.
-- Errors: "ERR data_state_invalid" (nothing written).
--#include key_types
--#include subscription
if not keyTypesMatch({'hash'}) then
  return redis.error_reply('ERR data_state_invalid')
end
local sub, raw = readSubscription(KEYS[1], ARGV[1])
if sub == nil then
  return redis.error_reply('ERR data_state_invalid')
end
if not sub then
  return {'subscription_not_found'}
end
-- The record is rewritten whole: one that is not this subscription (its
-- id, topic, name, status, creation time) is refused before the write.
if sub.id ~= ARGV[1] or type(sub.topicId) ~= 'string' or type(sub.name) ~= 'string' or
   type(sub.createdAt) ~= 'number' or (sub.status ~= 'online' and sub.status ~= 'paused') then
  return redis.error_reply('ERR data_state_invalid')
end
if sub.status ~= ARGV[2] then
  sub.status = ARGV[2]
  raw = cjson.encode(sub)
  redis.call('HSET', KEYS[1], ARGV[1], raw)
end
return {'ok', raw}
