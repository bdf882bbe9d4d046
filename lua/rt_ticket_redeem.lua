#!lua
-- rt_ticket_redeem: redeem a one-time WebSocket ticket atomically: the
-- first caller gets the stored value and the ticket is gone for everyone
-- else.
-- KEYS[1] ticket           han:rt:ticket:v2:<ticket_hash>
-- Returns the stored value ("<user_id> <exp_ms>"), or nil when the ticket is
-- unknown, expired or already used.
local v = redis.call('GET', KEYS[1])
if not v then
  return false
end
redis.call('DEL', KEYS[1])
return v
