#!lua
-- idem_takeover: take over the lock of an in-progress key whose owner's
-- instance is dead (its liveness marker, in another database, is gone), only
-- if the lock still holds the value the caller saw: of two survivors that
-- saw the same dead owner, exactly one gets the lock.
-- KEYS[1] record  han:api:idem:{<scope>:<user_id>:<key_hmac>}
-- KEYS[2] lock    han:api:idemlock:{<scope>:<user_id>:<key_hmac>}
-- KEYS[3] gone    han:api:idemgone:{<scope>:<user_id>:<key_hmac>}  abandoned owner tokens
-- ARGV[1] request fingerprint (hex)
-- ARGV[2] the lock value the caller saw (the dead owner's token)
-- ARGV[3] the caller's owner token
-- ARGV[4] lock TTL in ms
-- Returns what idem_reserve returns:
--   {'acquired', now_ms}                                       the caller owns the lock now
--   {'replay', status, resource_id, version, meta, now_ms}     completed with this fingerprint meanwhile
--   {'conflict', now_ms}                                       the key was used with another fingerprint
--   {'in_progress', lock_pttl_ms, now_ms, holder}              the lock changed hands: someone else runs it
--   {'abandoned', now_ms}                                      the caller gave this call up: nothing written
-- Errors: "ERR expiry_denied" when the ACL refuses PEXPIRE (nothing written).
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
if not redis.acl_check_cmd('pexpire', KEYS[1], ARGV[4]) then
  return redis.error_reply('ERR expiry_denied')
end
local rec = redis.call('HMGET', KEYS[1], 'state', 'fp', 'status', 'rid', 'ver', 'meta')
local state, fp = rec[1], rec[2]
if state == 'completed' then
  if fp ~= ARGV[1] then
    return {'conflict', now}
  end
  return {'replay', tonumber(rec[3]) or 0, rec[4] or '', tonumber(rec[5]) or 0, rec[6] or '', now}
end
if state and fp ~= ARGV[1] then
  return {'conflict', now}
end
local holder = redis.call('GET', KEYS[2])
if holder and holder ~= ARGV[2] and holder ~= ARGV[3] then
  return {'in_progress', redis.call('PTTL', KEYS[2]), now, holder}
end
if redis.call('SISMEMBER', KEYS[3], ARGV[3]) == 1 then
  return {'abandoned', now}
end
-- Still the dead owner's (or already gone, or ours): take it.
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
redis.call('HSET', KEYS[1], 'state', 'in_progress', 'fp', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {'acquired', now}
