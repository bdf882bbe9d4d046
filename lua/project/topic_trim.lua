#!lua
-- project_topic_trim: remove up to `batch` messages of a topic that are
-- terminal for every subscription (a message without subscriptions is
-- terminal from the start), with their receipts, and release their budget.
-- Receipts whose last allowed lease expired become `exhausted` on the way,
-- so their messages are trimmable by the next call. Expired dedupe records
-- are purged. Reads and checks come first.
-- KEYS[1] topics   han:prj:{<env>:<pid>}:q:topics     HASH topicId -> topic JSON
-- KEYS[2] budget   han:prj:{<env>:<pid>}:q:budget     HASH msg, rcpt, dd, tb:<tid>
-- KEYS[3] dd       han:prj:{<env>:<pid>}:q:dd         HASH identity -> dedupe JSON
-- KEYS[4] ddx      han:prj:{<env>:<pid>}:q:ddx        ZSET identity -> expiresAt ms
-- KEYS[5] stream   han:prj:{<env>:<pid>}:t:<tid>:s    STREAM messages
-- KEYS[6] tsubs    han:prj:{<env>:<pid>}:t:<tid>:subs SET subscription ids
-- KEYS[7] open     han:prj:{<env>:<pid>}:t:<tid>:o    HASH messageId -> receipts not yet terminal
-- KEYS[8] done     han:prj:{<env>:<pid>}:t:<tid>:d    ZSET messages terminal for every subscription
-- KEYS[9..] per subscription (ARGV[7..] order) its receipts HASH …:s:<sid>:r
--           and its leases ZSET …:s:<sid>:l
-- ARGV[1] topic id
-- ARGV[2] batch: most messages removed by this call; every one is looked
--         up in every subscription's receipts (one HMGET per subscription),
--         so the caller keeps batch x n bounded (Queue.Trim: 4,096)
-- ARGV[3] most attempts per receipt
-- ARGV[4] bytes reserved per receipt
-- ARGV[5] how many expired dedupe records to purge at most
-- ARGV[6] number of subscriptions n the caller saw
-- ARGV[7..6+n] their ids
-- Returns {'ok', trimmed, releasedBytes, more (1 | 0), purgedBytes} or,
-- with nothing written, {'topic_not_found'} | {'retry'} (the subscriptions
-- changed). releasedBytes are the trimmed messages' and receipts' bytes;
-- purgedBytes those of the expired dedupe records purged on the way (of
-- any topic of the project), which the module budget releases too.
-- Errors: "ERR data_state_invalid" (nothing written).
--#include key_types
--#include count
--#include topic_budget
--#include dedupe_expired
--#include dedupe_purge
--#include same_subscriptions
local n = tonumber(ARGV[6])
if not keyTypesMatch({'hash', 'hash', 'hash', 'zset', 'stream', 'set', 'hash', 'zset'}, 8 + 2 * n, {'hash', 'zset'}) then
  return redis.error_reply('ERR data_state_invalid')
end
local tid = ARGV[1]
if redis.call('HEXISTS', KEYS[1], tid) == 0 then
  if redis.call('EXISTS', KEYS[5], KEYS[6], KEYS[7], KEYS[8]) > 0 then
    return redis.error_reply('ERR data_state_invalid')
  end
  return {'topic_not_found'}
end
if not sameSubscriptions(KEYS[6], n, 6) then
  return {'retry'}
end
local msg, rcpt, dd, tb = topicBudget(KEYS[2], tid)
if not msg then
  return redis.error_reply('ERR data_state_invalid')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local batch, maxAttempts, per = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])

-- Reads: expired dedupe records, exhausted receipts, trimmable messages.
local expiredDD, purged = dedupeExpired(KEYS[3], KEYS[4], now, tonumber(ARGV[5]), dd)
if not expiredDD then
  return redis.error_reply('ERR data_state_invalid')
end
local exhaust = {}
local opens = {}
for i = 1, n do
  local rk, lk = KEYS[7 + 2 * i], KEYS[8 + 2 * i]
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', lk, '-inf', now)) do
    local raw = redis.call('HGET', rk, id)
    local ok, rec = false, nil
    if raw then
      ok, rec = pcall(cjson.decode, raw)
    end
    if not ok or type(rec) ~= 'table' or rec.s ~= 'leased' or type(rec.a) ~= 'number' then
      return redis.error_reply('ERR data_state_invalid')
    end
    if rec.a >= maxAttempts then
      local c = opens[id] or storedCount(redis.call('HGET', KEYS[7], id))
      if c == nil or c < 1 then
        return redis.error_reply('ERR data_state_invalid')
      end
      opens[id] = c - 1
      table.insert(exhaust, {rk, lk, id, rec})
    end
  end
end
local ids = redis.call('ZRANGE', KEYS[8], 0, batch - 1)
local freedMsg = 0
for _, id in ipairs(ids) do
  local e = redis.call('XRANGE', KEYS[5], id, id)
  if not e[1] then
    return redis.error_reply('ERR data_state_invalid')
  end
  -- The message's charge is b; an entry without b (b stays false), written
  -- before messages were charged their identifiers and overhead, was
  -- charged z, its payload bytes. A b that is not a number (nil) is
  -- refused.
  local f = e[1][2]
  local z, b = nil, false
  for j = 1, #f, 2 do
    if f[j] == 'z' then
      z = storedCount(f[j + 1])
    elseif f[j] == 'b' then
      b = storedCount(f[j + 1])
    end
  end
  if z == nil or b == nil or redis.call('HEXISTS', KEYS[7], id) == 1 then
    return redis.error_reply('ERR data_state_invalid')
  end
  freedMsg = freedMsg + (b or z)
end
-- The batch's receipts: one read per subscription, whatever the batch.
local held, receipts = {}, 0
if #ids > 0 then
  for i = 1, n do
    local got = redis.call('HMGET', KEYS[7 + 2 * i], unpack(ids))
    local here = {}
    for j = 1, #ids do
      if got[j] then
        here[#here + 1] = ids[j]
      end
    end
    held[i] = here
    receipts = receipts + #here
  end
end
local freedRcpt = receipts * per
if freedMsg > tb or freedRcpt > rcpt then
  return redis.error_reply('ERR data_state_invalid')
end

-- Writes.
dedupePurge(KEYS[3], KEYS[4], expiredDD)
for _, x in ipairs(exhaust) do
  local rk, lk, id, rec = x[1], x[2], x[3], x[4]
  rec.s, rec.u = 'exhausted', rec.l
  redis.call('HSET', rk, id, cjson.encode(rec))
  redis.call('ZREM', lk, id)
  if redis.call('HINCRBY', KEYS[7], id, -1) <= 0 then
    redis.call('HDEL', KEYS[7], id)
    redis.call('ZADD', KEYS[8], now, id)
  end
end
if #ids > 0 then
  redis.call('XDEL', KEYS[5], unpack(ids))
  redis.call('ZREM', KEYS[8], unpack(ids))
  for i = 1, n do
    if #held[i] > 0 then
      redis.call('HDEL', KEYS[7 + 2 * i], unpack(held[i]))
    end
  end
end
if freedMsg > 0 then
  redis.call('HINCRBY', KEYS[2], 'msg', -freedMsg)
  redis.call('HINCRBY', KEYS[2], 'tb:' .. tid, -freedMsg)
end
if freedRcpt > 0 then
  redis.call('HINCRBY', KEYS[2], 'rcpt', -freedRcpt)
end
if purged > 0 then
  redis.call('HINCRBY', KEYS[2], 'dd', -purged)
end
local more = 0
if redis.call('ZCARD', KEYS[8]) > 0 then
  more = 1
end
return {'ok', #ids, freedMsg + freedRcpt, more, purged}
