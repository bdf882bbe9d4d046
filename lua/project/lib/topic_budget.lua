-- topicBudget reads the project's reliable-byte budget HASH (msg, rcpt, dd and
-- the topic's tb:<tid>; a missing field is 0) and returns msg, rcpt, dd, tb,
-- or nil when a counter is not a non-negative number or the topic holds more
-- message bytes than the whole project: the caller then writes nothing.
local function topicBudget(budgetKey, tid)
  local b = redis.call('HMGET', budgetKey, 'msg', 'rcpt', 'dd', 'tb:' .. tid)
  local msg, rcpt, dd, tb = tonumber(b[1] or '0'), tonumber(b[2] or '0'), tonumber(b[3] or '0'), tonumber(b[4] or '0')
  if not (msg and rcpt and dd and tb) or msg < 0 or rcpt < 0 or dd < 0 or tb < 0 or tb > msg then
    return nil
  end
  return msg, rcpt, dd, tb
end
