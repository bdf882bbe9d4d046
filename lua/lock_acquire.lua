#!lua
-- lock_acquire: take a coordination lock and hand out a fencing token.
-- KEYS[1] lock key   han:coord:lock:<kind>:{<id>}
-- KEYS[2] fence key  han:coord:fence:<kind>:{<id>} (same hash tag)
-- ARGV[1] owner token (random, per acquisition)
-- ARGV[2] lock TTL in ms
-- ARGV[3] fence counter TTL in ms (24 h)
-- Returns {1, fence, now_ms} when acquired, {0, pttl_ms, now_ms} when held.
-- Errors: "ERR expiry_denied" when the ACL refuses PEXPIRE (nothing written).
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
if not redis.acl_check_cmd('pexpire', KEYS[2], ARGV[3]) then
  return redis.error_reply('ERR expiry_denied')
end
local ok = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
if not ok then
  return {0, redis.call('PTTL', KEYS[1]), now}
end
local fence = redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return {1, fence, now}
