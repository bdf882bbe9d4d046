#!lua
-- project_topic_claim: lease up to `count` messages of one subscription:
-- first receipts whose lease expired (attempt + 1; a receipt whose last
-- allowed attempt expired becomes terminal `exhausted` instead), then
-- messages never delivered (from the subscription's delivery position).
-- Every lease gets the next of the caller's fresh token hashes; the hashes
-- of every token a receipt issued are kept, so an ack can tell an earlier
-- lease's token (lease_expired) from a foreign one (lease_token_mismatch).
-- Reads and checks come first, then the writes. Structure: every key the
-- script writes is read before the first write (the done key, otherwise
-- only written, with TYPE), so a key of the wrong type fails that read
-- (WRONGTYPE, which the caller maps to data_state_invalid) with nothing
-- written; the stream is always read when count >= 1.
-- KEYS[1] topics    han:prj:{<env>:<pid>}:q:topics     HASH topicId -> topic JSON
-- KEYS[2] subs      han:prj:{<env>:<pid>}:q:subs       HASH subscriptionId -> subscription JSON
-- KEYS[3] stream    han:prj:{<env>:<pid>}:t:<tid>:s    STREAM messages {p, c, d, z, a}
-- KEYS[4] open      han:prj:{<env>:<pid>}:t:<tid>:o    HASH messageId -> receipts not yet terminal
-- KEYS[5] done      han:prj:{<env>:<pid>}:t:<tid>:d    ZSET messages terminal for every subscription
-- KEYS[6] receipts  han:prj:{<env>:<pid>}:s:<sid>:r    HASH messageId -> receipt JSON {s, a, l, u, r, h}
-- KEYS[7] leases    han:prj:{<env>:<pid>}:s:<sid>:l    ZSET leaseUntil ms -> messageId
-- ARGV[1] subscription id
-- ARGV[2] its topic id
-- ARGV[3] count (1..20)
-- ARGV[4] lease in ms
-- ARGV[5] most attempts per receipt
-- ARGV[6] project deliveryPaused (PostgreSQL): 1 | 0
-- ARGV[7] most expired leases to look at
-- ARGV[8..7+count] hex hashes of fresh tokens, one per possible lease
-- Returns {'ok', now, items} with items {{messageId, attempts, leaseUntil,
-- producerId, clientEventId, payload, sizeBytes, publishedAt, token index}},
-- or {'subscription_not_found' | 'delivery_paused' | 'subscription_paused'}
-- (nothing written).
-- Errors: "ERR data_state_invalid" and WRONGTYPE (nothing written).
--#include subscription
--#include clock
local sub, subRaw = readSubscription(KEYS[2], ARGV[1], 'pos')
if sub == nil then
  return redis.error_reply('ERR data_state_invalid')
end
if not sub or sub.topicId ~= ARGV[2] then
  return {'subscription_not_found'}
end
if redis.call('HEXISTS', KEYS[1], ARGV[2]) == 0 then
  return redis.error_reply('ERR data_state_invalid')
end
if ARGV[6] == '1' then
  return {'delivery_paused'}
end
if sub.status == 'paused' then
  return {'subscription_paused'}
end

local now, nowText = clockNow()
local count, leaseMs, maxAttempts = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])

local function receipt(id, want)
  local r = redis.call('HGET', KEYS[6], id)
  if not r then
    return nil
  end
  local ok, rec = pcall(cjson.decode, r)
  if not ok or type(rec) ~= 'table' or rec.s ~= want or type(rec.a) ~= 'number' or
    (rec.h ~= nil and (type(rec.h) ~= 'string' or not rec.h:find('^[%x,]*$'))) then
    return nil
  end
  return rec
end
local function fields(entry)
  local f = {}
  for i = 1, #entry[2], 2 do
    f[entry[2][i]] = entry[2][i + 1]
  end
  return f
end
local function openCount(id)
  local c = tonumber(redis.call('HGET', KEYS[4], id) or '0')
  return c ~= nil and c >= 1
end

-- Reads: expired leases, then new messages.
local exhaust, lease = {}, {}
local expired = redis.call('ZRANGEBYSCORE', KEYS[7], '-inf', nowText, 'LIMIT', '0', ARGV[7])
for _, id in ipairs(expired) do
  local rec = receipt(id, 'leased')
  if not rec or not openCount(id) then
    return redis.error_reply('ERR data_state_invalid')
  end
  if rec.a >= maxAttempts then
    table.insert(exhaust, {id, rec})
  elseif #lease < count then
    local e = redis.call('XRANGE', KEYS[3], id, id)
    if not e[1] then
      return redis.error_reply('ERR data_state_invalid')
    end
    table.insert(lease, {id, rec, fields(e[1])})
  end
end
local newPos
if #lease < count then
  local fresh = redis.call('XRANGE', KEYS[3], '(' .. sub.pos, '+', 'COUNT', #lease == 0 and ARGV[3] or decimal(count - #lease))
  for _, e in ipairs(fresh) do
    local rec = receipt(e[1], 'pending')
    if not rec or not openCount(e[1]) then
      return redis.error_reply('ERR data_state_invalid')
    end
    table.insert(lease, {e[1], rec, fields(e)})
    newPos = e[1]
  end
end

if #exhaust > 0 then
  local kt = redis.call('TYPE', KEYS[5])['ok']
  if kt ~= 'none' and kt ~= 'zset' then
    return redis.error_reply('ERR data_state_invalid')
  end
end

-- Writes.
for _, x in ipairs(exhaust) do
  local id, rec = x[1], x[2]
  rec.s, rec.u = 'exhausted', rec.l
  redis.call('HSET', KEYS[6], id, cjson.encode(rec))
  redis.call('ZREM', KEYS[7], id)
  if redis.call('HINCRBY', KEYS[4], id, -1) <= 0 then
    redis.call('HDEL', KEYS[4], id)
    redis.call('ZADD', KEYS[5], now, id)
  end
end
local items = {}
local leaseUntil = decimal(now + leaseMs)
for i, x in ipairs(lease) do
  local id, rec, f = x[1], x[2], x[3]
  local h = ARGV[7 + i]
  rec.s, rec.a, rec.l, rec.u = 'leased', rec.a + 1, now + leaseMs, now
  if rec.h == nil or rec.h == '' then
    rec.h = h
  else
    rec.h = rec.h .. ',' .. h
  end
  -- Built as text: the numbers and hex hashes need no escaping; a result
  -- (never set on a receipt that can be leased) would be encoded.
  redis.call('HSET', KEYS[6], id, '{"s":"leased","a":' .. decimal(rec.a) .. ',"l":' .. leaseUntil .. ',"u":' .. nowText ..
    (rec.r ~= nil and ',"r":' .. cjson.encode(rec.r) or '') .. ',"h":"' .. rec.h .. '"}')
  redis.call('ZADD', KEYS[7], leaseUntil, id)
  table.insert(items, {id, rec.a, rec.l, f.p or '', f.c or '', f.d or '', tonumber(f.z or '0'), tonumber(f.a or '0'), i})
end
if newPos then
  -- Only the position changes: replace it in the stored text (a JSON
  -- string value cannot hold an unescaped quote, so the pattern finds only
  -- the pos field), re-encoding the record when that is not its form.
  local moved, n = string.gsub(subRaw, '"pos":"[%d%-]*"', '"pos":"' .. newPos .. '"', 1)
  if n ~= 1 then
    sub.pos = newPos
    moved = cjson.encode(sub)
  end
  redis.call('HSET', KEYS[2], ARGV[1], moved)
end
return {'ok', now, items}
