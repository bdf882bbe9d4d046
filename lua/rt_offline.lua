#!lua
-- rt_offline: the debounced offline transition. When the user has no live
-- connection left, delete the online marker; the caller publishes the
-- transition only when this call deleted it, so it goes out once.
-- KEYS[1] user ZSET        han:rt:user:{<user_id>}:connections
-- KEYS[2] online marker    han:rt:user:{<user_id>}:online
-- ARGV[1] connection HASH TTL in ms (older members are stale, not live)
-- Returns {went_offline, now_ms}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = redis.call('ZCOUNT', KEYS[1], string.format('%d', now - tonumber(ARGV[1])), '+inf')
if live > 0 then
  return {0, now}
end
return {redis.call('DEL', KEYS[2]), now}
