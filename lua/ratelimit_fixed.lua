#!lua
-- ratelimit_fixed: fixed-window counter over one or more families of one
-- request, all or nothing: a denial by any family debits none. A window starts
-- with its first admitted request; the counter's INCR and its first PEXPIREAT
-- happen in this one script, so no counter is ever left without a TTL.
-- KEYS[i]       han:api:rl:<family>:…:<window>, a string counter whose expiry
--               time is window end + jitter (so PEXPIRETIME - jitter = window end)
-- ARGV[1]       request id (unused; same layout as the other rate-limit scripts)
-- ARGV[3i-1]    limit of KEYS[i] (integer >= 1)
-- ARGV[3i]      window of KEYS[i] in ms (integer >= 1)
-- ARGV[3i+1]    expiry jitter of KEYS[i] in ms, the same on every call for a key
-- Returns {allowed (1|0), remaining, retry_after_ms, reset_at_ms, now_ms,
--          remaining_1, reset_at_1, …, remaining_n, reset_at_n}.
--   denied: nothing is written; reset_at_ms is the latest window end among the
--   denying families, so a later request is admitted iff now_ms >= reset_at_ms.
-- Errors: "ERR invalid_argument"; "ERR expiry_denied" when the ACL refuses
-- PEXPIREAT (checked before the first write, so nothing is written).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = #KEYS
if n == 0 or #ARGV ~= 1 + 3 * n then
  return redis.error_reply('ERR invalid_argument')
end
local jit, avail, rst, deny, fresh, stale = {}, {}, {}, {}, {}, {}
local allowed = 1
for i = 1, n do
  local l, w, j = tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1])
  if not l or not w or not j or l < 1 or w < 1 or j < 0 then
    return redis.error_reply('ERR invalid_argument')
  end
  jit[i] = j
  local et = redis.call('PEXPIRETIME', KEYS[i])
  local cnt = 0
  if et > 0 and now < et - j then
    cnt = tonumber(redis.call('GET', KEYS[i]) or '0') or 0
    rst[i] = et - j
  else
    -- No window running: the key is absent, or in its jitter tail (or, never
    -- by this script, without a TTL) and is replaced on admission.
    fresh[i], stale[i] = true, et ~= -2
    rst[i] = now + w
  end
  avail[i] = l - cnt
  if cnt >= l then
    allowed, deny[i] = 0, true
  end
end

local out = {allowed, 0, 0, 0, now}
if allowed == 1 then
  for i = 1, n do
    if fresh[i] and not redis.acl_check_cmd('pexpireat', KEYS[i], tostring(rst[i] + jit[i])) then
      return redis.error_reply('ERR expiry_denied')
    end
  end
  local best
  for i = 1, n do
    if fresh[i] then
      if stale[i] then
        redis.call('DEL', KEYS[i])
      end
      redis.call('INCR', KEYS[i])
      redis.call('PEXPIREAT', KEYS[i], rst[i] + jit[i])
    else
      redis.call('INCR', KEYS[i])
    end
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
