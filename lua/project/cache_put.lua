#!lua
-- project_cache_put: write one project cache entry and its physical expiry
-- atomically, so no entry is ever left without its deadline. Validation and
-- reads come first; nothing is written when the structure is inconsistent,
-- the item is above the mirrored quota, the ACL denies PEXPIREAT, or
-- createOnly finds the key.
-- KEYS[1] meta       han:prj:{<env>:<pid>}:meta      HASH seq, cacheBytes, quota, paused, legacyDeadline
-- KEYS[2] index      han:prj:{<env>:<pid>}:cache:idx ZSET write seq -> relative key
-- KEYS[3] expiry     han:prj:{<env>:<pid>}:cache:exp ZSET expiresAt ms -> relative key
-- KEYS[4] sizes      han:prj:{<env>:<pid>}:cache:sz  HASH relative key -> sizeBytes
-- KEYS[5] container  han:prj:{<env>:<pid>}:cache     HASH legacy v1 entries
-- KEYS[6] entry      han:prj:{<env>:<pid>}:cache:e:<key> HASH t, v, e (expiresAt), u (updatedAt), s (seq)
-- ARGV[1] relative key
-- ARGV[2] type: json | string
-- ARGV[3] value
-- ARGV[4] TTL in ms (1000..2592000000)
-- ARGV[5] createOnly: 1 | 0
-- ARGV[6] sizeBytes (key + value)
-- ARGV[7] cacheQuotaBytes (PostgreSQL's, as the request read it)
-- ARGV[8] deliveryPaused: 1 | 0 (as the request read it)
-- ARGV[9] fixed legacy deadline in epoch ms, 0 when not fixed (as read)
-- ARGV[10] how many expired index members to purge on the way
-- ARGV[7..9] only create the mirror when the metadata HASH does not hold it
-- yet (a new project, an empty Redis restore): a mirror already there was
-- written by project_meta_sync, possibly after the request read PostgreSQL,
-- and is never rewound. The item must fit the mirrored quota too.
-- Returns {status, seq, expiresAt, now, mirrorDiffers}: status 1 created,
-- 2 replaced, 0 createOnly found the key, 3 the item is above the mirrored
-- quota (nothing written for 0 and 3); mirrorDiffers is 1 when the mirror
-- holds other values than ARGV[7..9] (the caller may rewrite it from
-- PostgreSQL under its row lock).
-- Errors: "ERR data_state_invalid", "ERR expiry_denied" (nothing written).
--#include key_types
--#include count
--#include cache_usage
--#include cache_forget
--#include legacy_deadline
if not keyTypesMatch({'hash', 'zset', 'zset', 'hash', 'hash', 'hash'}) then
  return redis.error_reply('ERR data_state_invalid')
end
local bytes = cacheUsage(KEYS[1], KEYS[2], KEYS[3], KEYS[4])
if not bytes then
  return redis.error_reply('ERR data_state_invalid')
end
local mirror = redis.call('HMGET', KEYS[1], 'quota', 'paused', 'legacyDeadline')
local differs = 0
if mirror[1] or mirror[2] or mirror[3] then
  if mirror[1] ~= ARGV[7] or mirror[2] ~= ARGV[8] or mirror[3] ~= ARGV[9] then
    differs = 1
  end
end
if mirror[1] then
  local q = storedCount(mirror[1])
  if q == nil then
    return redis.error_reply('ERR data_state_invalid')
  end
  if tonumber(ARGV[6]) > q then
    return {3, 0, 0, 0, differs}
  end
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expAt = now + tonumber(ARGV[4])
local deadline = tonumber(ARGV[9])
if not redis.acl_check_cmd('pexpireat', KEYS[6], tostring(expAt)) or
   not redis.acl_check_cmd('pexpireat', KEYS[5], tostring(expAt)) then
  return redis.error_reply('ERR expiry_denied')
end

local existed = redis.call('EXISTS', KEYS[6]) == 1
local inContainer = redis.call('HEXISTS', KEYS[5], ARGV[1]) == 1
local legacyLive = inContainer and not (deadline > 0 and deadline <= now)
if ARGV[5] == '1' and (existed or legacyLive) then
  return {0, 0, 0, now, differs}
end

local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. now, 'LIMIT', 0, tonumber(ARGV[10]))
local sizes = cacheSizes(KEYS[4], expired)
if not sizes or not cacheSizes(KEYS[4], {ARGV[1]}) then
  return redis.error_reply('ERR data_state_invalid')
end

-- Writes from here on.
bytes = cacheForget(KEYS[2], KEYS[3], KEYS[4], expired, sizes, bytes)
local old = tonumber(redis.call('HGET', KEYS[4], ARGV[1]) or '0')
bytes = bytes - old + tonumber(ARGV[6])
if bytes < 0 then
  bytes = tonumber(ARGV[6])
end
local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
redis.call('HSET', KEYS[1], 'cacheBytes', bytes)
redis.call('HSETNX', KEYS[1], 'quota', ARGV[7])
redis.call('HSETNX', KEYS[1], 'paused', ARGV[8])
redis.call('HSETNX', KEYS[1], 'legacyDeadline', ARGV[9])
redis.call('HSET', KEYS[6], 't', ARGV[2], 'v', ARGV[3], 'e', expAt, 'u', now, 's', seq)
redis.call('PEXPIREAT', KEYS[6], expAt)
redis.call('ZADD', KEYS[2], seq, ARGV[1])
redis.call('ZADD', KEYS[3], expAt, ARGV[1])
redis.call('HSET', KEYS[4], ARGV[1], ARGV[6])
if inContainer then
  -- Overwriting a legacy key makes it a normal entry.
  redis.call('HDEL', KEYS[5], ARGV[1])
end
-- Both PEXPIREAT checks passed above, so the deadline may always be set.
legacyDeadline(KEYS[5], deadline, now, true)
local status = 1
if existed or legacyLive then
  status = 2
end
return {status, seq, expAt, now, differs}
