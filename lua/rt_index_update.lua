#!lua
-- rt_index_update: one update of an instance's connection index: remove
-- members (connections that disconnected) and add others with score now
-- (the "<user_id>:~offline" members of offline checks this instance owes,
-- which a survivor that sweeps the index runs should the instance die
-- first).
-- KEYS[1] connection index han:rt:instance:{<instance_id>}:connections
-- ARGV[1] index TTL in ms (set when members are added)
-- ARGV[2] k: how many members to remove
-- ARGV[3..k+2] members to remove
-- ARGV[k+3..n] members to add (score = now)
-- Returns now_ms, the added members' score.
-- Errors: "ERR expiry_denied" when the ACL refuses PEXPIRE (nothing written).
-- Times and scores go to redis.call as integer text (TIME's own digits):
-- Lua's number-to-text conversion is floating-point formatting.
local t = redis.call('TIME')
local ms = math.floor(tonumber(t[2]) / 1000)
local now = tonumber(t[1]) * 1000 + ms
local nowText = t[1] .. string.format('%03d', ms)
local k = tonumber(ARGV[2])
local n = #ARGV
if n > k + 2 and not redis.acl_check_cmd('pexpire', KEYS[1], '1000') then
  return redis.error_reply('ERR expiry_denied')
end
local i = 3
while i <= k + 2 do
  local j = math.min(i + 499, k + 2)
  redis.call('ZREM', KEYS[1], unpack(ARGV, i, j))
  i = j + 1
end
while i <= n do
  local args = {}
  local j = i
  while j <= n and j < i + 500 do
    args[#args + 1] = nowText
    args[#args + 1] = ARGV[j]
    j = j + 1
  end
  redis.call('ZADD', KEYS[1], unpack(args))
  i = j
end
if n > k + 2 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return now
