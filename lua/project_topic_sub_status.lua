#!lua
-- project_topic_sub_status: set a subscription's status (online | paused).
-- Pausing stops new claims; leases already issued stay valid.
-- KEYS[1] subs  han:prj:{<env>:<pid>}:q:subs  HASH subscriptionId -> subscription JSON
-- ARGV[1] subscription id
-- ARGV[2] status: online | paused
-- Returns {'ok', subscription JSON} | {'subscription_not_found'}.
-- Errors: "ERR data_state_invalid" (nothing written).
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'none' and t ~= 'hash' then
  return redis.error_reply('ERR data_state_invalid')
end
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then
  return {'subscription_not_found'}
end
local ok, sub = pcall(cjson.decode, raw)
if not ok or type(sub) ~= 'table' then
  return redis.error_reply('ERR data_state_invalid')
end
if sub.status ~= ARGV[2] then
  sub.status = ARGV[2]
  raw = cjson.encode(sub)
  redis.call('HSET', KEYS[1], ARGV[1], raw)
end
return {'ok', raw}
