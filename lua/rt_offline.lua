#!lua
-- rt_offline: the debounced offline transition. When the user has no live
-- connection left, delete the online marker; the caller publishes the
-- transition only when this call deleted it, so it goes out once. A check
-- may be run again when its reply was lost (a timeout, while Redis may
-- still run it): the check that deleted the marker leaves its token, and
-- the same check run again answers went_offline=1 again.
-- KEYS[1] user ZSET        han:rt:user:{<user_id>}:connections
-- KEYS[2] online marker    han:rt:user:{<user_id>}:online
-- KEYS[3] offline record   han:rt:user:{<user_id>}:offline (optional):
--         the token of the check that deleted the marker
-- ARGV[1] connection HASH TTL in ms (older members are stale, not live)
-- ARGV[2] the check's token (with KEYS[3]), unique per scheduled check
-- ARGV[3] offline record TTL in ms (with KEYS[3]; the online marker's TTL)
-- Returns {went_offline, now_ms}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = redis.call('ZCOUNT', KEYS[1], string.format('%d', now - tonumber(ARGV[1])), '+inf')
if live > 0 then
  return {0, now}
end
if redis.call('DEL', KEYS[2]) == 1 then
  if KEYS[3] then
    redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[3])
  end
  return {1, now}
end
if KEYS[3] and redis.call('GET', KEYS[3]) == ARGV[2] then
  return {1, now}
end
return {0, now}
