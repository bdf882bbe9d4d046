#!lua
-- idem_release: give a key back (the request failed and is not stored), only
-- for the lock's owner; the key returns to absent.
-- KEYS[1] record  han:api:idem:{<scope>:<user_id>:<key_hmac>}
-- KEYS[2] lock    han:api:idemlock:{<scope>:<user_id>:<key_hmac>}
-- ARGV[1] owner token
-- Returns 1 released, 0 the lock belongs to another owner, -1 no lock.
-- A completed record is never deleted.
local cur = redis.call('GET', KEYS[2])
if not cur then
  return -1
end
if cur ~= ARGV[1] then
  return 0
end
if redis.call('HGET', KEYS[1], 'state') ~= 'completed' then
  redis.call('DEL', KEYS[1])
end
redis.call('DEL', KEYS[2])
return 1
