#!lua
-- ratelimit_sliding: sliding-log rate limit over one or more families of one
-- request, all or nothing: a denial by any family debits none, and a denied
-- request is not logged.
-- KEYS[i]       han:api:rl:<family>:…:<window>, a ZSET: member = request id,
--               score = admission time in ms (one entry per admitted request)
-- ARGV[1]       request id, unique per decision (the member written on admission)
-- ARGV[3i-1]    limit of KEYS[i] (integer >= 1)
-- ARGV[3i]      window of KEYS[i] in ms (integer >= 1)
-- ARGV[3i+1]    expiry jitter of KEYS[i] in ms (key TTL = window + jitter)
-- Returns {allowed (1|0), remaining, retry_after_ms, reset_at_ms, now_ms,
--          remaining_1, reset_at_1, …, remaining_n, reset_at_n}.
--   allowed: every family has room; then one entry is added to every key.
--   denied: nothing is written; reset_at_ms is the first instant at which every
--   denying family has room again (the latest of their oldest blocking entries
--   + window), so a later request is admitted iff its now_ms >= reset_at_ms.
-- Errors: "ERR invalid_argument"; "ERR expiry_denied" when the ACL refuses
-- PEXPIRE (checked before the first write, so nothing is written).
-- Numbers go to redis.call as integer text (string.format '%d', or TIME's
-- own digits): Lua's own number-to-text conversion is the C library's
-- floating-point formatting, which costs more than the commands here.
local t = redis.call('TIME')
local nowMs = math.floor(tonumber(t[2]) / 1000)
local now = tonumber(t[1]) * 1000 + nowMs
local nowText = t[1] .. string.format('%03d', nowMs)
local n = #KEYS
if n == 0 or #ARGV ~= 1 + 3 * n then
  return redis.error_reply('ERR invalid_argument')
end
local win, ttl, avail, rst, deny = {}, {}, {}, {}, {}
local allowed = 1
for i = 1, n do
  local l, w, j = tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1])
  if not l or not w or not j or l < 1 or w < 1 or j < 0 then
    return redis.error_reply('ERR invalid_argument')
  end
  win[i], ttl[i] = w, string.format('%d', w + j)
  local from = '(' .. string.format('%d', now - w)
  local cnt = redis.call('ZCOUNT', KEYS[i], from, '+inf')
  avail[i] = l - cnt
  if cnt < l then
    if cnt == 0 then
      rst[i] = now + w
    else
      local first = redis.call('ZRANGEBYSCORE', KEYS[i], from, '+inf', 'WITHSCORES', 'LIMIT', '0', '1')
      rst[i] = tonumber(first[2]) + w
    end
  else
    -- cnt - l + 1 entries must leave the window; the last of them is the
    -- (cnt - l)-th (0-based) oldest entry inside it.
    allowed, deny[i] = 0, true
    local e = redis.call('ZRANGEBYSCORE', KEYS[i], from, '+inf', 'WITHSCORES', 'LIMIT', string.format('%d', cnt - l), '1')
    rst[i] = tonumber(e[2]) + w
  end
end

local out = {allowed, 0, 0, 0, now}
if allowed == 1 then
  for i = 1, n do
    if not redis.acl_check_cmd('pexpire', KEYS[i], ttl[i]) then
      return redis.error_reply('ERR expiry_denied')
    end
  end
  local best
  for i = 1, n do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', string.format('%d', now - win[i]))
    redis.call('ZADD', KEYS[i], nowText, ARGV[1])
    redis.call('PEXPIRE', KEYS[i], ttl[i])
    avail[i] = avail[i] - 1
    if not best or avail[i] < avail[best] or (avail[i] == avail[best] and rst[i] > rst[best]) then
      best = i
    end
  end
  out[2], out[4] = avail[best], rst[best]
else
  local rem, reset
  for i = 1, n do
    if avail[i] < 0 then avail[i] = 0 end
    if not rem or avail[i] < rem then rem = avail[i] end
    if deny[i] and (not reset or rst[i] > reset) then reset = rst[i] end
  end
  out[2], out[3], out[4] = rem, reset - now, reset
end
for i = 1, n do
  out[#out + 1] = avail[i]
  out[#out + 1] = rst[i]
end
return out
