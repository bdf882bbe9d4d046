#!lua
-- rt_instance_heartbeat: refresh an instance's liveness marker and its
-- connection index (the sweeper's list of what to remove if it dies), and
-- add or refresh index members.
-- KEYS[1] liveness marker  han:rt:instance:{<instance_id>}
-- KEYS[2] connection index han:rt:instance:{<instance_id>}:connections
-- ARGV[1] liveness TTL in ms (default 10 s)
-- ARGV[2] index TTL in ms (120 s)
-- ARGV[3..n] index members "<user_id>:<connection_id>" (score = now)
-- Returns {now_ms, marker_was_present}.
-- Errors: "ERR expiry_denied" when the ACL refuses PEXPIRE (nothing written).
-- Times and scores go to redis.call as integer text (TIME's own digits):
-- Lua's number-to-text conversion is floating-point formatting.
local t = redis.call('TIME')
local ms = math.floor(tonumber(t[2]) / 1000)
local now = tonumber(t[1]) * 1000 + ms
local nowText = t[1] .. string.format('%03d', ms)
if not redis.acl_check_cmd('pexpire', KEYS[1], '1000') or not redis.acl_check_cmd('pexpire', KEYS[2], '1000') then
  return redis.error_reply('ERR expiry_denied')
end
local present = redis.call('EXISTS', KEYS[1])
redis.call('SET', KEYS[1], nowText, 'PX', ARGV[1])
local n = #ARGV
local i = 3
while i <= n do
  local args = {}
  local j = i
  while j <= n and j < i + 500 do
    args[#args + 1] = nowText
    args[#args + 1] = ARGV[j]
    j = j + 1
  end
  redis.call('ZADD', KEYS[2], unpack(args))
  i = j
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return {now, present}
