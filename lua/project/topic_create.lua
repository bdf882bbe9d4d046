#!lua
-- project_topic_create: create a topic of the project Redis API unless its name
-- is taken. Reads and checks come first.
-- KEYS[1] topics  han:prj:{<env>:<pid>}:q:topics  HASH topicId -> topic JSON {id, name, description, createdAt}
-- KEYS[2] names   han:prj:{<env>:<pid>}:q:tnames  HASH topic name -> topicId
-- ARGV[1] new topic id (UUID)
-- ARGV[2] name
-- ARGV[3] description
-- ARGV[4] most topics a project may hold
-- Returns {'ok', createdAt} | {'topic_name_taken'} | {'limit'} (nothing written).
-- Errors: "ERR data_state_invalid" (nothing written).
--#include key_types
if not keyTypesMatch({'hash', 'hash'}) then
  return redis.error_reply('ERR data_state_invalid')
end
local owner = redis.call('HGET', KEYS[2], ARGV[2])
if owner then
  if redis.call('HEXISTS', KEYS[1], owner) == 0 then
    return redis.error_reply('ERR data_state_invalid')
  end
  return {'topic_name_taken'}
end
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[4]) then
  return {'limit'}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode({id = ARGV[1], name = ARGV[2], description = ARGV[3], createdAt = now}))
redis.call('HSET', KEYS[2], ARGV[2], ARGV[1])
return {'ok', now}
