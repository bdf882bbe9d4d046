#!lua
-- idem_reserve: reserve an idempotency key, compare its fingerprint and take
-- its lock in one step (states: absent -> in_progress -> completed).
-- KEYS[1] record  han:api:idem:{<scope>:<user_id>:<key_hmac>}      HASH state, fp, status, rid, ver, meta, at_ms
-- KEYS[2] lock    han:api:idemlock:{<scope>:<user_id>:<key_hmac>}  owner token (same hash tag)
-- KEYS[3] gone    han:api:idemgone:{<scope>:<user_id>:<key_hmac>}  SET of abandoned owner tokens (idem_abandon)
-- ARGV[1] request fingerprint (hex)
-- ARGV[2] owner token (random, per request)
-- ARGV[3] lock TTL in ms; an in-progress record carries the same TTL, so a
--         crashed owner's key returns to absent when its lock expires
-- Returns one of
--   {'acquired', now_ms}                                   the caller owns the lock and runs the request
--   {'replay', status, resource_id, version, meta, now_ms}  completed with this fingerprint
--   {'conflict', now_ms}                                    the key was used with another fingerprint
--   {'in_progress', lock_pttl_ms, now_ms, holder}           another request holds the lock; holder is
--                                                          its owner token (names its instance)
--   {'abandoned', now_ms}                                   this owner gave the call up (idem_abandon)
--                                                          before it reached Redis: nothing written
-- Errors: "ERR expiry_denied" when the ACL refuses PEXPIRE (nothing written).
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
if not redis.acl_check_cmd('pexpire', KEYS[1], ARGV[3]) then
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
-- A call that reaches Redis after its owner gave it up (a stalled server, a
-- late TCP segment) takes nothing: no request runs under that token.
if redis.call('SISMEMBER', KEYS[3], ARGV[2]) == 1 then
  return {'abandoned', now}
end
-- Take the lock unless someone holds it (NX), reading the holder in the same
-- command (GET): false when this call took it.
local holder = redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3], 'NX', 'GET')
if holder == ARGV[2] then
  -- A client retry of this very call (the first reply was lost): still ours.
  return {'acquired', now}
end
if holder then
  return {'in_progress', redis.call('PTTL', KEYS[2]), now, holder}
end
-- Absent, or in progress with this fingerprint and no owner left (the lock
-- expired with its owner): taken above.
redis.call('HSET', KEYS[1], 'state', 'in_progress', 'fp', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {'acquired', now}
