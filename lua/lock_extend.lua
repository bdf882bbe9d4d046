#!lua
-- lock_extend: extend a lock only for its owner.
-- KEYS[1] lock key
-- ARGV[1] owner token
-- ARGV[2] new TTL in ms
-- Returns 1 extended, 0 not the owner (lost), -1 no lock (expired).
local cur = redis.call('GET', KEYS[1])
if not cur then
  return -1
end
if cur ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
