#!lua flags=no-writes
-- project_cache_state: the consistent state a cache listing or a snapshot
-- starts from, with the structure checks (read-only, so it works under OOM).
-- KEYS[1] meta, KEYS[2] index, KEYS[3] expiry, KEYS[4] sizes, KEYS[5] container
-- (as in project_cache_put.lua)
-- ARGV[1] how many expired-but-unpurged members to account for (bound)
-- Returns {now, metaExists (1|0), seq, usageBytes, entries, containerFields,
-- containerPTTL (-2 absent, -1 no TTL, else ms), metaQuota, metaPaused,
-- metaLegacyDeadline, expiredMembers}; usage and entries leave out the same
-- index members already past their deadline, at most ARGV[1] of them, so the
-- two always describe the same entries. expiredMembers is how many members
-- past their deadline the index holds: when it exceeds the bound, the caller
-- forgets them (project_cache_prune) and reads again for exact figures.
-- Errors: "ERR data_state_invalid".
--#include key_types
--#include count
--#include cache_usage
if not keyTypesMatch({'hash', 'zset', 'zset', 'hash', 'hash'}) then
  return redis.error_reply('ERR data_state_invalid')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local containerFields = redis.call('HLEN', KEYS[5])
local containerTTL = redis.call('PTTL', KEYS[5])
local bytes, hasMeta = cacheUsage(KEYS[1], KEYS[2], KEYS[3], KEYS[4])
if not bytes then
  return redis.error_reply('ERR data_state_invalid')
end
if not hasMeta then
  return {now, 0, 0, 0, 0, containerFields, containerTTL, '', '', '', 0}
end
local m = redis.call('HMGET', KEYS[1], 'seq', 'quota', 'paused', 'legacyDeadline')
local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. now, 'LIMIT', 0, tonumber(ARGV[1]))
if #gone > 0 then
  for _, s in ipairs(redis.call('HMGET', KEYS[4], unpack(gone))) do
    local n = storedCount(s)
    if not n then
      return redis.error_reply('ERR data_state_invalid')
    end
    bytes = bytes - n
  end
end
if bytes < 0 then
  bytes = 0
end
local entries = redis.call('ZCARD', KEYS[2]) - #gone
if entries < 0 then
  entries = 0
end
local expired = redis.call('ZCOUNT', KEYS[3], '-inf', '(' .. now)
return {now, 1, tonumber(m[1] or '0'), bytes, entries, containerFields, containerTTL, m[2] or '', m[3] or '', m[4] or '',
  expired}
