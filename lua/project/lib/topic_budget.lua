-- topicBudget reads the project's reliable-byte budget HASH (msg, rcpt, dd and
-- the topic's tb:<tid>; a missing field is 0) and returns msg, rcpt, dd, tb,
-- or nil when a counter is not a decimal integer as HINCRBY writes one (no
-- sign, fraction, exponent or leading zero; at most 15 digits) or the topic
-- holds more message bytes than the whole project: the caller then writes
-- nothing.
local function topicBudget(budgetKey, tid)
  local b = redis.call('HMGET', budgetKey, 'msg', 'rcpt', 'dd', 'tb:' .. tid)
  for i = 1, 4 do
    local v = b[i] or '0'
    if #v > 15 or not (v == '0' or string.find(v, '^[1-9]%d*$')) then
      return nil
    end
  end
  local msg, rcpt, dd, tb = tonumber(b[1] or '0'), tonumber(b[2] or '0'), tonumber(b[3] or '0'), tonumber(b[4] or '0')
  if tb > msg then
    return nil
  end
  return msg, rcpt, dd, tb
end
