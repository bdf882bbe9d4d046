#!lua
-- stub_task_create: create a legacy safety stub task in DB2
-- (docs/legacy-stub.md). Runs as ACL user legacy_stub.
-- KEYS[1] task HASH  han:stub:task:{<task_id>}
-- ARGV[1] TTL in ms (poll interval × max polls + recovery budget)
-- Returns {created, now_ms}: created is 1 when the task was written, 0 when
-- it already existed (left untouched: a retry never resets a task).
-- The HASH is {state = "pending", polls = 0, verdict = "", created_ms}.
-- Errors: "ERR expiry_denied" when the ACL refuses PEXPIRE, "ERR invalid
-- arguments" (nothing written either way).
local ttl = tonumber(ARGV[1])
if not ttl or ttl < 1 then
  return redis.error_reply('ERR invalid arguments')
end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
if not redis.acl_check_cmd('pexpire', KEYS[1], ARGV[1]) then
  return redis.error_reply('ERR expiry_denied')
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0, now}
end
redis.call('HSET', KEYS[1], 'state', 'pending', 'polls', 0, 'verdict', '', 'created_ms', now)
redis.call('PEXPIRE', KEYS[1], ttl)
return {1, now}
