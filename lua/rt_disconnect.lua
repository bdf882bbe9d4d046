#!lua
-- rt_disconnect: remove one connection; idempotent (a duplicate disconnect
-- removes nothing and reports the same remaining count).
-- KEYS[1] connection HASH  han:rt:conn:{<user_id>}:<connection_id>
-- KEYS[2] user ZSET        han:rt:user:{<user_id>}:connections
-- KEYS[3] closed marker    han:rt:conn:{<user_id>}:<connection_id>:closed
--         (optional; TTL ARGV[2]): the socket is closed, and a periodic
--         heartbeat sent before it closed must not register it again
-- ARGV[1] connection id
-- ARGV[2] connection HASH TTL in ms: members with an older heartbeat are
--         stale and not counted as live
-- ARGV[3] stale batch: at most this many stale members are removed
-- ARGV[4] fresh window in ms (optional; the sweep of a dead instance): a
--         member whose heartbeat is newer than now - ARGV[4] is spared,
--         because its instance registered it again after it was found dead,
--         and nothing is written
-- Returns {removed, live_remaining, now_ms}; removed is 1 when this call
-- deleted the HASH or the ZSET member, -1 when it spared a fresh member.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cutoff = string.format('%d', now - tonumber(ARGV[2]))
if ARGV[4] then
  local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
  if score and tonumber(score) > now - tonumber(ARGV[4]) then
    return {-1, redis.call('ZCOUNT', KEYS[2], cutoff, '+inf'), now}
  end
end
local stale = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. cutoff, 'LIMIT', '0', ARGV[3])

if KEYS[3] then
  redis.call('SET', KEYS[3], '1', 'PX', ARGV[2])
end
local removed = redis.call('DEL', KEYS[1])
if redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then
  removed = 1
end
if #stale > 0 then
  redis.call('ZREM', KEYS[2], unpack(stale))
end
local live = redis.call('ZCOUNT', KEYS[2], cutoff, '+inf')
return {removed, live, now}
