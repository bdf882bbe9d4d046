#!lua
-- rt_heartbeat: register or refresh one WebSocket connection (its HASH and
-- its member of the user's ZSET, with their TTLs, in one step), enforcing the
-- per-user connection cap on registration, and remove a bounded batch of the
-- user's stale connection members.
-- KEYS[1] connection HASH  han:rt:conn:{<user_id>}:<connection_id>
-- KEYS[2] user ZSET        han:rt:user:{<user_id>}:connections
-- KEYS[3] online marker    han:rt:user:{<user_id>}:online, holding the time
--         in ms of the user's latest registration or refresh
-- KEYS[4] closed marker    han:rt:conn:{<user_id>}:<connection_id>:closed
--         (optional, passed by the periodic refresh): a connection whose
--         socket closed (its disconnect left the marker) is not registered
--         again
-- ARGV[1] user id
-- ARGV[2] connection id
-- ARGV[3] instance id
-- ARGV[4] subscriptions count
-- ARGV[5] connection HASH TTL in ms (90 s)
-- ARGV[6] user ZSET and online marker TTL in ms (120 s)
-- ARGV[7] stale batch: at most this many members whose heartbeat is older
--         than the HASH TTL are removed by this call
-- ARGV[8] per-user connection cap, 0 (or absent) for none: a connection that
--         is not registered (no member in the ZSET, or a stale one: its HASH
--         has expired) is refused when the user already has this many live
--         members (heartbeat within the HASH TTL), whatever instance holds
--         them; the refresh of a registered connection (a live member) is
--         never refused. Connect passes the cap, and so does the periodic
--         refresh: a connection that survivors swept while its instance
--         looked dead (a long pause) comes back only within the cap.
-- Returns {now_ms, became_online, removed_stale, refused}; became_online is
-- 1 when the online marker was absent (the user's first live connection);
-- refused is 1 when the cap refused the connection (nothing written); 2
-- when the connection had closed (nothing written).
-- Errors: "ERR expiry_denied" when the ACL refuses PEXPIRE (nothing written).
-- Times and scores go to redis.call as integer text (TIME's own digits):
-- Lua's number-to-text conversion is floating-point formatting.
local t = redis.call('TIME')
local ms = math.floor(tonumber(t[2]) / 1000)
local now = tonumber(t[1]) * 1000 + ms
local nowText = t[1] .. string.format('%03d', ms)
for i = 1, 3 do
  if not redis.acl_check_cmd('pexpire', KEYS[i], '1000') then
    return redis.error_reply('ERR expiry_denied')
  end
end
local connTTL = tonumber(ARGV[5])
local cap = tonumber(ARGV[8]) or 0
if KEYS[4] and redis.call('EXISTS', KEYS[4]) == 1 then
  return {now, 0, 0, 2}
end
local cut = string.format('%d', now - connTTL)
-- A member whose heartbeat is older than cut is stale, the rest are live.
-- The member count (O(1)) spares the reads below when they cannot matter:
-- a user with no members has nothing stale, and one with fewer members than
-- the cap cannot be at it.
local n = redis.call('ZCARD', KEYS[2])
if cap > 0 and n >= cap then
  local own = redis.call('ZSCORE', KEYS[2], ARGV[2])
  if (not own or tonumber(own) < now - connTTL) and redis.call('ZCOUNT', KEYS[2], cut, '+inf') >= cap then
    return {now, 0, 0, 1}
  end
end
local stale = {}
if n > 0 then
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. cut, 'LIMIT', '0', ARGV[7])) do
    if m ~= ARGV[2] then
      stale[#stale + 1] = m
    end
  end
end

redis.call('HSET', KEYS[1], 'user_id', ARGV[1], 'instance', ARGV[3], 'last_seen', nowText, 'subscriptions_count', ARGV[4])
redis.call('PEXPIRE', KEYS[1], connTTL)
redis.call('ZADD', KEYS[2], nowText, ARGV[2])
if #stale > 0 then
  redis.call('ZREM', KEYS[2], unpack(stale))
end
redis.call('PEXPIRE', KEYS[2], ARGV[6])
-- The online marker's previous value tells whether the user was online;
-- its value is the time of this registration or refresh (rt_offline
-- compares it with the disconnect its check follows).
local wasOnline = redis.call('SET', KEYS[3], nowText, 'PX', ARGV[6], 'GET')
if wasOnline then
  return {now, 0, #stale, 0}
end
return {now, 1, #stale, 0}
