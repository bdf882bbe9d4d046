#!lua
-- stub_task_poll: one client poll of a legacy safety stub task: read the
-- task and count the poll in one step (get + increment: the stub is the
-- only place where this pattern is allowed). The poll that brings the
-- count to ARGV[1] decides the verdict. Runs as ACL user legacy_stub.
-- KEYS[1] task HASH  han:stub:task:{<task_id>}
-- ARGV[1] polls before a verdict (>= 1)
-- ARGV[2] the verdict to record if this poll decides ("approved" or
--         "rejected", drawn at random by the caller)
-- Returns {state, polls, verdict, created_ms, now_ms} after counting this
-- poll, or nil when the task does not exist (expired, lost with DB2, or
-- never created): nothing is written then, so a poll never creates a key
-- without a TTL. Counting keeps the task's TTL.
-- Errors: "ERR invalid arguments" (nothing written).
local need = tonumber(ARGV[1])
if not need or need < 1 or (ARGV[2] ~= 'approved' and ARGV[2] ~= 'rejected') then
  return redis.error_reply('ERR invalid arguments')
end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local h = redis.call('HMGET', KEYS[1], 'state', 'polls', 'verdict', 'created_ms')
if not h[1] then
  return false
end
local state, verdict = h[1], h[3]
local polls = redis.call('HINCRBY', KEYS[1], 'polls', 1)
if state == 'pending' and polls >= need then
  state, verdict = 'done', ARGV[2]
  redis.call('HSET', KEYS[1], 'state', state, 'verdict', verdict)
end
return {state, polls, verdict, tonumber(h[4]) or 0, now}
