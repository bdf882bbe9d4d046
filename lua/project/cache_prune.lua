#!lua flags=allow-oom
-- project_cache_prune: lazy cleanup after a listing (or before a snapshot):
-- forget index members whose entry was found expired or evicted, purge
-- expired members, and apply the fixed legacy deadline to the container.
-- Best effort: callers ignore its failure. Never extends anything; allow-oom
-- because it only removes data or rewrites an existing field.
-- KEYS[1] meta, KEYS[2] index, KEYS[3] expiry, KEYS[4] sizes, KEYS[5] container
-- (as in project_cache_put.lua)
-- ARGV[1] fixed legacy deadline in epoch ms, 0 when not fixed
-- ARGV[2] how many expired index members to purge
-- ARGV[3..] pairs: relative key, the write seq at which it was found missing
-- Returns the number of index members removed.
-- Errors: "ERR data_state_invalid" (nothing written).
--#include key_types
--#include count
--#include cache_forget
--#include legacy_deadline
if not keyTypesMatch({'hash', 'zset', 'zset', 'hash', 'hash'}) then
  return redis.error_reply('ERR data_state_invalid')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = tonumber(ARGV[1])
local canExpire = redis.acl_check_cmd('pexpireat', KEYS[5], tostring(now))
local hasMeta = redis.call('EXISTS', KEYS[1]) == 1
local bytes = 0
if hasMeta then
  bytes = storedCount(redis.call('HGET', KEYS[1], 'cacheBytes'))
  if bytes == nil then
    return redis.error_reply('ERR data_state_invalid')
  end
end
local gone, sizes = {}, {}
if hasMeta then
  gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. now, 'LIMIT', 0, tonumber(ARGV[2]))
  for i = 3, #ARGV, 2 do
    -- A PUT since the listing gave the key a new seq: keep it.
    local score = redis.call('ZSCORE', KEYS[2], ARGV[i])
    if score and tonumber(score) == tonumber(ARGV[i + 1]) then
      table.insert(gone, ARGV[i])
    end
  end
  sizes = cacheSizes(KEYS[4], gone)
  if not sizes then
    return redis.error_reply('ERR data_state_invalid')
  end
end

-- Writes from here on.
local removed = 0
if hasMeta then
  bytes, removed = cacheForget(KEYS[2], KEYS[3], KEYS[4], gone, sizes, bytes)
  if bytes < 0 then
    bytes = 0
  end
  redis.call('HSET', KEYS[1], 'cacheBytes', bytes)
end
legacyDeadline(KEYS[5], deadline, now, canExpire)
return removed
