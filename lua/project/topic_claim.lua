#!lua
-- project_topic_claim: lease messages of one subscription for one or more
-- claims, in order, each up to its own count: first receipts whose lease
-- expired (attempt + 1; a receipt whose last allowed attempt expired
-- becomes terminal `exhausted` instead), then messages never delivered
-- (from the subscription's delivery position). The claims share the
-- messages found as separate calls in the same order would: the first
-- takes the first ones. Every lease gets the next of its claim's fresh
-- token hashes; the hashes of every token a receipt issued are kept, so an
-- ack can tell an earlier lease's token (lease_expired) from a foreign one
-- (lease_token_mismatch).
-- Reads and checks come first, then the writes. Structure: every key the
-- script writes is read before the first write (the done key, otherwise
-- only written, with TYPE), so a key of the wrong type fails that read
-- (WRONGTYPE, which the caller maps to data_state_invalid) with nothing
-- written; the stream is always read when a count is >= 1. The receipts
-- and open counts of the messages looked at are read with one HMGET each,
-- and the leases are written with one HSET and one ZADD, whatever their
-- number.
-- KEYS[1] topics    han:prj:{<env>:<pid>}:q:topics     HASH topicId -> topic JSON
-- KEYS[2] subs      han:prj:{<env>:<pid>}:q:subs       HASH subscriptionId -> subscription JSON
-- KEYS[3] stream    han:prj:{<env>:<pid>}:t:<tid>:s    STREAM messages {p, c, d, z, a, b}
-- KEYS[4] open      han:prj:{<env>:<pid>}:t:<tid>:o    HASH messageId -> receipts not yet terminal
-- KEYS[5] done      han:prj:{<env>:<pid>}:t:<tid>:d    ZSET messages terminal for every subscription
-- KEYS[6] receipts  han:prj:{<env>:<pid>}:s:<sid>:r    HASH messageId -> receipt JSON {s, a, l, u, r, h}
-- KEYS[7] leases    han:prj:{<env>:<pid>}:s:<sid>:l    ZSET leaseUntil ms -> messageId
-- ARGV[1] subscription id
-- ARGV[2] its topic id
-- ARGV[3] lease in ms
-- ARGV[4] most attempts per receipt
-- ARGV[5] project deliveryPaused (PostgreSQL): 1 | 0
-- ARGV[6] most expired leases to look at
-- then two per claim:
--   count (1..20)
--   hashes of fresh tokens, one per possible lease: count times 32 hex
--   digits, concatenated (one argument instead of count)
-- Returns {'ok', now, items of the first claim, items of the second, …}
-- with items {{messageId, attempts, leaseUntil, producerId, clientEventId,
-- payload, sizeBytes, publishedAt, token index}}, or
-- {'subscription_not_found' | 'delivery_paused' | 'subscription_paused'}
-- for every claim (nothing written).
-- Errors: "ERR data_state_invalid" and WRONGTYPE (nothing written).
--#include subscription
--#include count
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
if ARGV[5] == '1' then
  return {'delivery_paused'}
end
if sub.status == 'paused' then
  return {'subscription_paused'}
end

local now, nowText = clockNow()
local leaseMs, maxAttempts = tonumber(ARGV[3]), tonumber(ARGV[4])
-- claims[c] is {count, hashes} of claim c; count is their sum.
local claims, count = {}, 0
for a = 7, #ARGV, 2 do
  local n = tonumber(ARGV[a])
  if not n or n < 1 or #(ARGV[a + 1] or '') ~= 32 * n then
    return redis.error_reply('ERR token hashes do not match count')
  end
  table.insert(claims, {n, ARGV[a + 1]})
  count = count + n
end
if #claims == 0 then
  return redis.error_reply('ERR token hashes do not match count')
end

-- The receipt a publish writes has one form, built as text: it is
-- recognised without decoding. Any other text is decoded and checked.
local function receipt(r, want)
  if not r then
    return nil
  end
  if want == 'pending' and r:find('^{"s":"pending","a":0,"l":0,"u":%d+,"h":""}$') then
    return {s = 'pending', a = 0, h = ''}
  end
  local ok, rec = pcall(cjson.decode, r)
  if not ok or type(rec) ~= 'table' or rec.s ~= want or type(rec.a) ~= 'number' or
    (rec.h ~= nil and (type(rec.h) ~= 'string' or not rec.h:find('^[%x,]*$'))) then
    return nil
  end
  return rec
end
local function openCount(c)
  c = storedCount(c)
  return c ~= nil and c >= 1
end
-- item is the reply row of a lease; a publish writes the fields p, c, d,
-- z, a in this order (then b), anything else is looked up by name.
local function item(id, attempts, leaseUntilMs, fv, index)
  if not (fv[1] == 'p' and fv[3] == 'c' and fv[5] == 'd' and fv[7] == 'z' and fv[9] == 'a') then
    local f = {}
    for i = 1, #fv, 2 do
      f[fv[i]] = fv[i + 1]
    end
    fv = {'p', f.p or '', 'c', f.c or '', 'd', f.d or '', 'z', f.z or '0', 'a', f.a or '0'}
  end
  return {id, attempts, leaseUntilMs, fv[2], fv[4], fv[6], tonumber(fv[8]) or 0, tonumber(fv[10]) or 0, index}
end

-- Reads: expired leases, then new messages.
local exhaust, lease = {}, {}
local expired = redis.call('ZRANGEBYSCORE', KEYS[7], '-inf', nowText, 'LIMIT', '0', ARGV[6])
if #expired > 0 then
  local recs = redis.call('HMGET', KEYS[6], unpack(expired))
  local opens = redis.call('HMGET', KEYS[4], unpack(expired))
  for i, id in ipairs(expired) do
    local rec = receipt(recs[i], 'leased')
    if not rec or not openCount(opens[i]) then
      return redis.error_reply('ERR data_state_invalid')
    end
    if rec.a >= maxAttempts then
      table.insert(exhaust, {id, rec})
    elseif #lease < count then
      local e = redis.call('XRANGE', KEYS[3], id, id)
      if not e[1] then
        return redis.error_reply('ERR data_state_invalid')
      end
      table.insert(lease, {id, rec, e[1][2]})
    end
  end
end
local newPos
if #lease < count then
  local fresh = redis.call('XRANGE', KEYS[3], '(' .. sub.pos, '+', 'COUNT', decimal(count - #lease))
  if #fresh > 0 then
    local ids = {}
    for i, e in ipairs(fresh) do
      ids[i] = e[1]
    end
    local recs = redis.call('HMGET', KEYS[6], unpack(ids))
    local opens = redis.call('HMGET', KEYS[4], unpack(ids))
    for i, e in ipairs(fresh) do
      local rec = receipt(recs[i], 'pending')
      if not rec or not openCount(opens[i]) then
        return redis.error_reply('ERR data_state_invalid')
      end
      table.insert(lease, {e[1], rec, e[2]})
    end
    newPos = ids[#ids]
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
-- The leases go to the claims in order: claim c takes the next count of
-- its own, each with the next of its own token hashes.
local reply = {'ok', now}
for c = 1, #claims do
  reply[2 + c] = {}
end
if #lease > 0 then
  local leaseUntilMs = now + leaseMs
  local leaseUntil = decimal(leaseUntilMs)
  local records, scores = {}, {}
  local c, k = 1, 0
  for i, x in ipairs(lease) do
    if k == claims[c][1] then
      c, k = c + 1, 0
    end
    k = k + 1
    local id, rec = x[1], x[2]
    local h = string.sub(claims[c][2], 32 * k - 31, 32 * k)
    if rec.h == nil or rec.h == '' then
      rec.h = h
    else
      rec.h = rec.h .. ',' .. h
    end
    local attempts = rec.a + 1
    -- Built as text: the numbers and hex hashes need no escaping; a result
    -- (never set on a receipt that can be leased) would be encoded.
    records[2 * i - 1] = id
    records[2 * i] = '{"s":"leased","a":' .. decimal(attempts) .. ',"l":' .. leaseUntil .. ',"u":' .. nowText ..
      (rec.r ~= nil and ',"r":' .. cjson.encode(rec.r) or '') .. ',"h":"' .. rec.h .. '"}'
    scores[2 * i - 1] = leaseUntil
    scores[2 * i] = id
    reply[2 + c][k] = item(id, attempts, leaseUntilMs, x[3], k)
  end
  redis.call('HSET', KEYS[6], unpack(records))
  redis.call('ZADD', KEYS[7], unpack(scores))
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
return reply
