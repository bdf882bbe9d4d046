#!lua
-- ratelimit_bucket: token bucket over one or more families of one request,
-- all or nothing (used for the service family). A bucket holds
-- `limit` tokens and refills completely over `window`. Integer arithmetic:
-- one token = `window` credit units and the bucket gains `limit` units per ms,
-- so capacity = limit * window units and no rounding drifts.
-- KEYS[i]       han:api:rl:<family>:…:<window>, a HASH {c = credit units,
--               t = time of the last admission in ms}; absent = full bucket
-- ARGV[1]       request id (unused; same layout as the other rate-limit scripts)
-- ARGV[3i-1]    limit (bucket capacity in tokens) of KEYS[i] (integer >= 1)
-- ARGV[3i]      window of KEYS[i] in ms: time to refill from empty to full
-- ARGV[3i+1]    expiry jitter of KEYS[i] in ms (key TTL = window + jitter, by
--               which time the bucket is full again, the same as absent)
-- Returns {allowed (1|0), remaining, retry_after_ms, reset_at_ms, now_ms,
--          remaining_1, reset_at_1, …, remaining_n, reset_at_n}; remaining is
--   whole tokens. Allowed: reset_at is when the bucket is full again. Denied:
--   nothing is written; reset_at_ms is the first ms at which every denying
--   bucket holds a token again, so a later request is admitted iff
--   now_ms >= reset_at_ms.
-- Errors: "ERR invalid_argument"; "ERR expiry_denied" when the ACL refuses
-- PEXPIRE (checked before the first write, so nothing is written).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = #KEYS
if n == 0 or #ARGV ~= 1 + 3 * n then
  return redis.error_reply('ERR invalid_argument')
end
local function ceildiv(a, b)
  local q = math.floor(a / b)
  if q * b < a then q = q + 1 end
  return q
end
local lim, win, jit, credit, avail, rst, deny = {}, {}, {}, {}, {}, {}, {}
local allowed = 1
for i = 1, n do
  local l, w, j = tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1])
  if not l or not w or not j or l < 1 or w < 1 or j < 0 or l * w > 1125899906842624 then
    return redis.error_reply('ERR invalid_argument')
  end
  lim[i], win[i], jit[i] = l, w, j
  local cap = l * w
  local c = cap
  local v = redis.call('HMGET', KEYS[i], 'c', 't')
  if v[1] then
    local el = now - (tonumber(v[2]) or now)
    if el < 0 then el = 0 end
    c = math.min(cap, (tonumber(v[1]) or cap) + el * l)
  end
  credit[i] = c
  avail[i] = math.floor(c / w)
  if c >= w then
    rst[i] = now + ceildiv(cap - (c - w), l)
  else
    allowed, deny[i] = 0, true
    rst[i] = now + ceildiv(w - c, l)
  end
end

local out = {allowed, 0, 0, 0, now}
if allowed == 1 then
  for i = 1, n do
    if not redis.acl_check_cmd('pexpire', KEYS[i], tostring(win[i] + jit[i])) then
      return redis.error_reply('ERR expiry_denied')
    end
  end
  local best
  for i = 1, n do
    local c = credit[i] - win[i]
    redis.call('HSET', KEYS[i], 'c', string.format('%.0f', c), 't', string.format('%.0f', now))
    redis.call('PEXPIRE', KEYS[i], win[i] + jit[i])
    avail[i] = math.floor(c / win[i])
    if not best or avail[i] < avail[best] or (avail[i] == avail[best] and rst[i] > rst[best]) then
      best = i
    end
  end
  out[2], out[4] = avail[best], rst[best]
else
  local rem, reset
  for i = 1, n do
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
