#!lua
-- rt_instances_add: record an instance in the registry survivors read to
-- find dead instances (score = last liveness refresh).
-- KEYS[1] registry ZSET    han:rt:instances
-- ARGV[1] instance id
-- ARGV[2] registry TTL in ms (120 s, refreshed by every live instance)
-- Returns now_ms.
-- Errors: "ERR expiry_denied" when the ACL refuses PEXPIRE (nothing written).
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
if not redis.acl_check_cmd('pexpire', KEYS[1], '1000') then
  return redis.error_reply('ERR expiry_denied')
end
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return now
