#!lua
-- lock_release: compare-and-delete; only the owner releases.
-- KEYS[1] lock key
-- ARGV[1] owner token
-- Returns 1 released, 0 not the owner (lost), -1 no lock (expired).
local cur = redis.call('GET', KEYS[1])
if not cur then
  return -1
end
if cur ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
