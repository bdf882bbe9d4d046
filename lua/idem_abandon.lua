#!lua
-- idem_abandon: the owner of a reserve or takeover whose reply never came
-- (a timeout, a lost connection) gives the key back without knowing whether
-- the call ran. A Redis that stalled instead of failing runs such a call
-- when it wakes, and its lock would then stand for a request that no longer
-- runs, answering every retry "in progress" until the lock's TTL. So the
-- lock is released if this owner holds it, and the token is marked
-- abandoned so a copy of the call that reaches Redis later takes nothing
-- (idem_reserve and idem_takeover check the mark before taking the lock).
-- KEYS[1] record  han:api:idem:{<scope>:<user_id>:<key_hmac>}
-- KEYS[2] lock    han:api:idemlock:{<scope>:<user_id>:<key_hmac>}
-- KEYS[3] gone    han:api:idemgone:{<scope>:<user_id>:<key_hmac>}  SET of abandoned owner tokens
-- ARGV[1] owner token
-- ARGV[2] mark TTL in ms (the lock TTL: a call later than that finds the mark
--         gone, and its lock expires on its own)
-- Returns 1 the owner's lock was released, 0 it held no lock (marked only).
-- A completed record is never deleted.
-- Errors: "ERR expiry_denied" when the ACL refuses PEXPIRE (nothing written).
if not redis.acl_check_cmd('pexpire', KEYS[3], ARGV[2]) then
  return redis.error_reply('ERR expiry_denied')
end
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('PEXPIRE', KEYS[3], ARGV[2])
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return 0
end
if redis.call('HGET', KEYS[1], 'state') ~= 'completed' then
  redis.call('DEL', KEYS[1])
end
redis.call('DEL', KEYS[2])
return 1
