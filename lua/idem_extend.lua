#!lua
-- idem_extend: the owner's heartbeat; extends the lock and the in-progress
-- record together.
-- KEYS[1] record  han:api:idem:{<scope>:<user_id>:<key_hmac>}
-- KEYS[2] lock    han:api:idemlock:{<scope>:<user_id>:<key_hmac>}
-- ARGV[1] owner token
-- ARGV[2] lock TTL in ms
-- Returns 1 extended, 0 the lock belongs to another owner, -1 no lock.
-- Errors: "ERR expiry_denied" when the ACL refuses PEXPIRE.
if not redis.acl_check_cmd('pexpire', KEYS[2], ARGV[2]) then
  return redis.error_reply('ERR expiry_denied')
end
local cur = redis.call('GET', KEYS[2])
if not cur then
  return -1
end
if cur ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[2], ARGV[2])
if redis.call('HGET', KEYS[1], 'state') == 'in_progress' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1
