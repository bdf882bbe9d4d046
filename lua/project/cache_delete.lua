#!lua flags=allow-oom
-- project_cache_delete: delete one project cache entry (normal or legacy).
-- Validation and reads come first; nothing is written when the structure is
-- inconsistent. allow-oom: deleting is how a full noeviction Redis gets room
-- back, and the script only removes data or rewrites an existing field.
-- KEYS[1] meta, KEYS[2] index, KEYS[3] expiry, KEYS[4] sizes, KEYS[5] container,
-- KEYS[6] entry (as in project_cache_put.lua)
-- ARGV[1] relative key
-- ARGV[2] fixed legacy deadline in epoch ms, 0 when not fixed
-- ARGV[3] how many expired index members to purge on the way
-- Returns {deleted (1|0), now}.
-- Errors: "ERR data_state_invalid" (nothing written).
--#include key_types
--#include cache_usage
--#include cache_forget
--#include legacy_deadline
if not keyTypesMatch({'hash', 'zset', 'zset', 'hash', 'hash', 'hash'}) then
  return redis.error_reply('ERR data_state_invalid')
end
local bytes, hasMeta = cacheUsage(KEYS[1], KEYS[2], KEYS[3], KEYS[4])
if not bytes then
  return redis.error_reply('ERR data_state_invalid')
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = tonumber(ARGV[2])
local canExpire = redis.acl_check_cmd('pexpireat', KEYS[5], tostring(now))
local existed = redis.call('EXISTS', KEYS[6]) == 1
local inContainer = redis.call('HEXISTS', KEYS[5], ARGV[1]) == 1
local legacyLive = inContainer and not (deadline > 0 and deadline <= now)
local forget, sizes = {}, {}
if hasMeta then
  forget = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. now, 'LIMIT', 0, tonumber(ARGV[3]))
  table.insert(forget, ARGV[1])
  sizes = cacheSizes(KEYS[4], forget)
  if not sizes then
    return redis.error_reply('ERR data_state_invalid')
  end
end

-- Writes from here on.
if existed then
  redis.call('DEL', KEYS[6])
end
if inContainer then
  redis.call('HDEL', KEYS[5], ARGV[1])
end
if hasMeta then
  bytes = cacheForget(KEYS[2], KEYS[3], KEYS[4], forget, sizes, bytes)
  if bytes < 0 then
    bytes = 0
  end
  redis.call('HSET', KEYS[1], 'cacheBytes', bytes)
end
legacyDeadline(KEYS[5], deadline, now, canExpire)
if existed or legacyLive then
  return {1, now}
end
return {0, now}
