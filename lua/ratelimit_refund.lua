#!lua
-- ratelimit_refund: give back one family's admission of a request that a
-- later family denied, when the families are evaluated in turn because their
-- keys live in different Redis Cluster slots, so that a denied request
-- debits no family. It only changes a
-- key that exists and never touches its expiry, so it can neither create a
-- key nor leave one without a TTL.
-- KEYS[1]  the family key the admission was written to
-- ARGV[1]  algorithm: sliding | fixed | bucket
-- ARGV[2]  request id of the admission (sliding: the member to remove)
-- ARGV[3]  window in ms
-- ARGV[4]  expiry jitter in ms
-- ARGV[5]  reset_at_ms the admission reported (fixed: names its window; an
--          admission of a window that has ended is not refunded)
-- ARGV[6]  limit (bucket: capacity in tokens)
-- Returns 1 when the admission was given back, 0 when there was nothing left
-- to give back (the key expired or the window rolled over).
local algo = ARGV[1]
if algo == 'sliding' then
  return redis.call('ZREM', KEYS[1], ARGV[2])
end
local w, j, reset, l = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
if not w or not j or not reset or not l then
  return redis.error_reply('ERR invalid_argument')
end
if algo == 'fixed' then
  local et = redis.call('PEXPIRETIME', KEYS[1])
  if et <= 0 or et - j ~= reset then
    return 0
  end
  local v = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
  if v <= 0 then
    return 0
  end
  redis.call('DECR', KEYS[1])
  return 1
elseif algo == 'bucket' then
  local c = redis.call('HGET', KEYS[1], 'c')
  if not c then
    return 0
  end
  redis.call('HSET', KEYS[1], 'c', string.format('%.0f', math.min(l * w, tonumber(c) + w)))
  return 1
end
return redis.error_reply('ERR invalid_argument')
