#!lua
-- project_topic_sub_create: create a subscription on a topic. It receives
-- the messages published after its creation: its delivery position starts
-- at the topic's last message.
-- KEYS[1] topics   han:prj:{<env>:<pid>}:q:topics     HASH topicId -> topic JSON
-- KEYS[2] subs     han:prj:{<env>:<pid>}:q:subs       HASH subscriptionId -> subscription JSON
--                  {id, topicId, name, status, createdAt, from, pos}
-- KEYS[3] tsubs    han:prj:{<env>:<pid>}:t:<tid>:subs SET subscription ids of the topic
-- KEYS[4] stream   han:prj:{<env>:<pid>}:t:<tid>:s    STREAM messages
-- ARGV[1] new subscription id (UUID)
-- ARGV[2] topic id
-- ARGV[3] name
-- ARGV[4] most subscriptions a project may hold
-- Returns {'ok', createdAt} | {'topic_not_found'} | {'limit'} (nothing written).
-- Errors: "ERR data_state_invalid" (nothing written).
--#include key_types
if not keyTypesMatch({'hash', 'hash', 'set', 'stream'}) then
  return redis.error_reply('ERR data_state_invalid')
end
if redis.call('HEXISTS', KEYS[1], ARGV[2]) == 0 then
  if redis.call('EXISTS', KEYS[3], KEYS[4]) > 0 then
    return redis.error_reply('ERR data_state_invalid')
  end
  return {'topic_not_found'}
end
if redis.call('HLEN', KEYS[2]) >= tonumber(ARGV[4]) then
  return {'limit'}
end
local last = redis.call('XREVRANGE', KEYS[4], '+', '-', 'COUNT', 1)
local from = '0-0'
if last[1] then
  from = last[1][1]
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[2], ARGV[1], cjson.encode({id = ARGV[1], topicId = ARGV[2], name = ARGV[3],
  status = 'online', createdAt = now, from = from, pos = from}))
redis.call('SADD', KEYS[3], ARGV[1])
return {'ok', now}
