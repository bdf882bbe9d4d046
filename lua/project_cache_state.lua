#!lua flags=no-writes
-- project_cache_state: the consistent state a cache listing or a snapshot
-- starts from, with the structure checks (read-only, so it works under OOM).
-- KEYS[1] meta, KEYS[2] index, KEYS[3] expiry, KEYS[4] sizes, KEYS[5] container
-- (as in project_cache_put.lua)
-- ARGV[1] how many expired-but-unpurged members to account for (bound)
-- Returns {now, metaExists (1|0), seq, usageBytes, entries, containerFields,
-- containerPTTL (-2 absent, -1 no TTL, else ms), metaQuota, metaPaused,
-- metaLegacyDeadline}; usage and entries leave out entries already past
-- their deadline.
-- Errors: "ERR data_state_invalid".
local wants = {'hash', 'zset', 'zset', 'hash', 'hash'}
for i = 1, 5 do
  local t = redis.call('TYPE', KEYS[i])['ok']
  if t ~= 'none' and t ~= wants[i] then
    return redis.error_reply('ERR data_state_invalid')
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local containerFields = redis.call('HLEN', KEYS[5])
local containerTTL = redis.call('PTTL', KEYS[5])
if redis.call('EXISTS', KEYS[1]) == 0 then
  if redis.call('EXISTS', KEYS[2], KEYS[3], KEYS[4]) > 0 then
    return redis.error_reply('ERR data_state_invalid')
  end
  return {now, 0, 0, 0, 0, containerFields, containerTTL, '', '', ''}
end
local m = redis.call('HMGET', KEYS[1], 'seq', 'cacheBytes', 'quota', 'paused', 'legacyDeadline')
local top = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
local bytes = tonumber(m[2] or '0')
if bytes == nil or bytes < 0 or (top[2] and (m[1] == false or tonumber(m[1]) < tonumber(top[2]))) then
  return redis.error_reply('ERR data_state_invalid')
end
local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. now, 'LIMIT', 0, tonumber(ARGV[1]))
if #gone > 0 then
  for _, s in ipairs(redis.call('HMGET', KEYS[4], unpack(gone))) do
    bytes = bytes - tonumber(s or '0')
  end
end
if bytes < 0 then
  bytes = 0
end
local entries = redis.call('ZCARD', KEYS[2]) - redis.call('ZCOUNT', KEYS[3], '-inf', '(' .. now)
if entries < 0 then
  entries = 0
end
return {now, 1, tonumber(m[1] or '0'), bytes, entries, containerFields, containerTTL, m[3] or '', m[4] or '', m[5] or ''}
