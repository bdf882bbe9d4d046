#!lua
-- idem_complete: record a completed request, only for the lock's owner.
-- KEYS[1] record  han:api:idem:{<scope>:<user_id>:<key_hmac>}
-- KEYS[2] lock    han:api:idemlock:{<scope>:<user_id>:<key_hmac>}
-- ARGV[1] owner token
-- ARGV[2] fingerprint (hex)
-- ARGV[3] HTTP status of the stored outcome
-- ARGV[4] resource id
-- ARGV[5] resource version
-- ARGV[6] meta (what rebuilding the response needs; never a body, token or URL)
-- ARGV[7] record TTL in ms, >= 1: what is left of the PostgreSQL record's life
--         (HAN_IDEMPOTENCY_TTL, 24 h by default, counted from the request's start)
-- Returns 1 completed (lock released), 0 the lock belongs to another owner,
-- -1 no lock (it expired); nothing is written unless 1.
-- Errors: "ERR expiry_denied" when the ACL refuses PEXPIRE (nothing written).
local t = redis.call('TIME')
-- at_ms as integer text from TIME's digits (Lua's number formatting is the
-- C library's floating-point printf).
local now = t[1] .. string.format('%03d', math.floor(t[2] / 1000))
if not redis.acl_check_cmd('pexpire', KEYS[1], ARGV[7]) then
  return redis.error_reply('ERR expiry_denied')
end
local cur = redis.call('GET', KEYS[2])
if not cur then
  return -1
end
if cur ~= ARGV[1] then
  return 0
end
-- The in-progress record holds state and fp only, both overwritten here.
redis.call('HSET', KEYS[1], 'state', 'completed', 'fp', ARGV[2], 'status', ARGV[3],
  'rid', ARGV[4], 'ver', ARGV[5], 'meta', ARGV[6], 'at_ms', now)
redis.call('PEXPIRE', KEYS[1], ARGV[7])
redis.call('DEL', KEYS[2])
return 1
