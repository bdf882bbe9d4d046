#!lua
-- rt_disconnect_user: remove several connections of one user at once (a
-- draining instance's teardown: many users' calls share a pipeline, each
-- call on its own user's hash tag). Idempotent: connections already gone
-- remove nothing. Stale members are left to the heartbeat, so the call is
-- four commands whatever the number of connections.
-- KEYS[1]    user ZSET        han:rt:user:{<user_id>}:connections
-- KEYS[2..n] connection HASHes han:rt:conn:{<user_id>}:<connection_id>, in
--            the order of the connection ids
-- ARGV[1]    connection HASH TTL in ms: members with an older heartbeat are
--            stale and not counted as live
-- ARGV[2..n] connection ids
-- Returns {removed, live_remaining, now_ms}; removed counts the ZSET
-- members this call removed.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local removed = 0
if #ARGV > 1 then
  removed = redis.call('ZREM', KEYS[1], unpack(ARGV, 2))
end
if #KEYS > 1 then
  redis.call('DEL', unpack(KEYS, 2))
end
local live = redis.call('ZCOUNT', KEYS[1], string.format('%d', now - tonumber(ARGV[1])), '+inf')
return {removed, live, now}
