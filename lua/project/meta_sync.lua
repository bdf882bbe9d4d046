#!lua
-- project_meta_sync: mirror the PostgreSQL project metadata into the
-- project's Redis metadata HASH (after PUT /settings). The HASH is project
-- metadata and has no TTL, like the reliable keys (docs/redis-keys.md).
-- KEYS[1] meta, KEYS[2] index, KEYS[3] expiry, KEYS[4] sizes (as in project_cache_put.lua)
-- ARGV[1] cacheQuotaBytes
-- ARGV[2] deliveryPaused: 1 | 0
-- ARGV[3] fixed legacy deadline in epoch ms, 0 when not fixed
-- Returns 1.
-- Errors: "ERR data_state_invalid" (nothing written).
--#include key_types
if not keyTypesMatch({'hash', 'zset', 'zset', 'hash'}) then
  return redis.error_reply('ERR data_state_invalid')
end
if redis.call('EXISTS', KEYS[1]) == 0 and redis.call('EXISTS', KEYS[2], KEYS[3], KEYS[4]) > 0 then
  return redis.error_reply('ERR data_state_invalid')
end
redis.call('HSET', KEYS[1], 'quota', ARGV[1], 'paused', ARGV[2], 'legacyDeadline', ARGV[3])
return 1
