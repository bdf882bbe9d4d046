#!lua
-- rt_disconnect_user: remove several connections of one user at once (a
-- draining instance's teardown: many users' calls share a pipeline, each
-- call on its own user's hash tag). Idempotent: connections already gone
-- remove nothing. Stale members are left to the heartbeat, so the call is
-- four commands, and one per closed marker, whatever the number of
-- connections.
-- KEYS[1]    user ZSET        han:rt:user:{<user_id>}:connections
-- KEYS[2..n+1] connection HASHes han:rt:conn:{<user_id>}:<connection_id>,
--            in the order of the n connection ids
-- KEYS[n+2..2n+1] closed markers han:rt:conn:{<user_id>}:<connection_id>:closed
--            (optional, all or none; TTL ARGV[1]): the sockets are closed,
--            and a periodic heartbeat sent before they closed (a refresh on
--            its way when a drain began) must not register them again
-- ARGV[1]    connection HASH TTL in ms: members with an older heartbeat are
--            stale and not counted as live
-- ARGV[2..n+1] connection ids
-- Returns {removed, live_remaining, now_ms}; removed counts the ZSET
-- members this call removed.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = #ARGV - 1
local removed = 0
if n > 0 then
  removed = redis.call('ZREM', KEYS[1], unpack(ARGV, 2))
  redis.call('DEL', unpack(KEYS, 2, n + 1))
end
for i = n + 2, #KEYS do
  redis.call('SET', KEYS[i], '1', 'PX', ARGV[1])
end
local live = redis.call('ZCOUNT', KEYS[1], string.format('%d', now - tonumber(ARGV[1])), '+inf')
return {removed, live, now}
