#!lua flags=no-writes
-- rt_presence: count a user's live connections (read-only, works under OOM).
-- KEYS[1] user ZSET        han:rt:user:{<user_id>}:connections
-- ARGV[1] connection HASH TTL in ms (older members are stale, not live)
-- Returns {live_count, now_ms}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {redis.call('ZCOUNT', KEYS[1], string.format('%d', now - tonumber(ARGV[1])), '+inf'), now}
