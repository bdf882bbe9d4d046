#!lua
-- project_topic_ack: record the outcome (processed | failed) of one or more
-- receipts of one subscription, each fenced by its lease token in the same
-- script that acknowledges (unlike a bare XACK, which accepts any
-- consumer's ack). The items are handled in order, each as if it were a
-- script of its own: a later item sees what an earlier one wrote. The
-- current lease's token before leaseUntil acknowledges; the same token
-- again with the same status and result is an idempotent replay, with
-- another one a conflict; a token of an earlier lease of this receipt, or
-- the current one after its lease ended, is lease_expired; any other token
-- lease_token_mismatch. Pausing does not matter here: valid leases can
-- always be acknowledged.
-- KEYS[1] subs      han:prj:{<env>:<pid>}:q:subs     HASH subscriptionId -> subscription JSON
-- KEYS[2] open      han:prj:{<env>:<pid>}:t:<tid>:o  HASH messageId -> receipts not yet terminal
-- KEYS[3] done      han:prj:{<env>:<pid>}:t:<tid>:d  ZSET messages terminal for every subscription
-- KEYS[4] receipts  han:prj:{<env>:<pid>}:s:<sid>:r  HASH messageId -> receipt JSON {s, a, l, u, r, h}
-- KEYS[5] leases    han:prj:{<env>:<pid>}:s:<sid>:l  ZSET leaseUntil ms -> messageId
-- ARGV[1] subscription id
-- ARGV[2] its topic id
-- then one item of four per ack:
--   message id, hex hash of the presented token, status (processed |
--   failed), result (may be empty)
-- Returns one row per item: {'ok', receipt JSON, applied (1 | 0 for a
-- replay)} or, with nothing written for that item,
-- {'subscription_not_found' | 'message_not_found' | 'lease_expired' |
-- 'lease_token_mismatch' | 'receipt_conflict' | 'data_state_invalid'}.
-- Structure: the subs, receipts and open keys are read before any write,
-- the done key is checked with TYPE when an ack will write it, and the
-- first write is the ZREM of the leases key; on a key of the wrong type
-- that command fails (WRONGTYPE, which the caller maps to
-- data_state_invalid) with nothing written. The receipts and open counts
-- of all items are read with one HMGET each, and the writes of all items
-- share one command per key.
-- Errors: WRONGTYPE (nothing written).
--#include subscription
--#include count
--#include clock
local m = (#ARGV - 2) / 4
if m < 1 or m ~= math.floor(m) then
  return redis.error_reply('ERR ack items')
end
local ids = {}
for j = 1, m do
  ids[j] = ARGV[4 * j - 1]
end
-- A subscription's receipts go with it (the scripts that delete it delete
-- them), so a receipt shows the subscription exists; its record is decoded
-- only when there is none, to tell the two outcomes apart.
local known = redis.call('HEXISTS', KEYS[1], ARGV[1])
local stored = redis.call('HMGET', KEYS[4], unpack(ids))
local opens = redis.call('HMGET', KEYS[2], unpack(ids))
local now, nowText = clockNow()
local noReceipt
local function missing()
  if noReceipt == nil then
    local sub = readSubscription(KEYS[1], ARGV[1])
    if sub == nil then
      noReceipt = {'data_state_invalid'}
    elseif not sub or sub.topicId ~= ARGV[2] then
      noReceipt = {'subscription_not_found'}
    else
      noReceipt = {'message_not_found'}
    end
  end
  return noReceipt
end

-- current[id] is a receipt's text and open[id] its open count as the items
-- so far left them.
local current, open = {}, {}
for j, id in ipairs(ids) do
  if current[id] == nil then
    current[id] = stored[j] or false
    open[id] = opens[j] or false
  end
end

-- A leased receipt has one form, built as text by the claim: it is read
-- without decoding. Any other text is decoded and checked.
local function decode(r)
  local aText, lText, h = r:match('^{"s":"leased","a":(%d+),"l":(%d+),"u":%d+,"h":"([%x,]*)"}$')
  if aText then
    return {s = 'leased', a = tonumber(aText), l = tonumber(lText), h = h}, aText, lText
  end
  local ok, rec = pcall(cjson.decode, r)
  if not ok or type(rec) ~= 'table' or type(rec.s) ~= 'string' or type(rec.l) ~= 'number' or type(rec.a) ~= 'number' or
    (rec.h ~= nil and (type(rec.h) ~= 'string' or not rec.h:find('^[%x,]*$'))) then
    return nil
  end
  return rec, decimal(rec.a), decimal(rec.l)
end

-- ack answers one item and, when it acknowledges, returns the receipt's
-- new text and its open count before.
local function ack(id, hash, status, result)
  local r = current[id]
  if not r or known == 0 then
    return missing()
  end
  local rec, aText, lText = decode(r)
  if not rec then
    return {'data_state_invalid'}
  end
  -- The hashes of the tokens the receipt issued, the current one last.
  local cur, earlier = nil, false
  if rec.h and rec.h:find('^%x+$') then
    cur = rec.h
  elseif rec.h then
    local hashes = {}
    for x in string.gmatch(rec.h, '[^,]+') do
      table.insert(hashes, x)
    end
    cur = hashes[#hashes]
    for i = 1, #hashes - 1 do
      if hashes[i] == hash then
        earlier = true
      end
    end
  end
  if rec.s == 'processed' or rec.s == 'failed' then
    if cur == hash then
      if rec.s == status and (rec.r or '') == result then
        return {'ok', r, 0}
      end
      return {'receipt_conflict'}
    end
    if earlier then
      return {'lease_expired'}
    end
    return {'lease_token_mismatch'}
  end
  if rec.s == 'exhausted' then
    if earlier or cur == hash then
      return {'lease_expired'}
    end
    return {'lease_token_mismatch'}
  end
  if rec.s ~= 'leased' then
    -- pending: no token was ever issued
    return {'lease_token_mismatch'}
  end
  if earlier or (cur == hash and now >= rec.l) then
    return {'lease_expired'}
  end
  if cur ~= hash then
    return {'lease_token_mismatch'}
  end
  local c = storedCount(open[id])
  if c == nil or c < 1 then
    return {'data_state_invalid'}
  end
  -- The record is built as text (as the claim builds it): the hex hashes
  -- and the numbers need no escaping, nor do processed and failed; any
  -- other status and a non-empty result are encoded.
  local st = (status == 'processed' or status == 'failed') and '"' .. status .. '"' or cjson.encode(status)
  r = '{"s":' .. st .. ',"a":' .. aText .. ',"l":' .. lText .. ',"u":' .. nowText ..
    ',"r":' .. (result == '' and '""' or cjson.encode(result)) .. ',"h":"' .. (rec.h or '') .. '"}'
  return {'ok', r, 1}, c
end

local rows, acked, records, terminal, counted = {}, {}, {}, {}, {}
for j, id in ipairs(ids) do
  local row, c = ack(id, ARGV[4 * j], ARGV[4 * j + 1], ARGV[4 * j + 2])
  rows[j] = row
  if c then
    current[id] = row[2]
    table.insert(acked, id)
    table.insert(records, id)
    table.insert(records, row[2])
    if c <= 1 then
      open[id] = false
      table.insert(terminal, id)
    else
      open[id] = decimal(c - 1)
      table.insert(counted, id)
    end
  end
end
if #acked == 0 then
  return rows
end
if #terminal > 0 then
  local kt = redis.call('TYPE', KEYS[3])['ok']
  if kt ~= 'none' and kt ~= 'zset' then
    return redis.error_reply('ERR data_state_invalid')
  end
end

-- Writes; the first one fails on a leases key of another type.
redis.call('ZREM', KEYS[5], unpack(acked))
redis.call('HSET', KEYS[4], unpack(records))
if #terminal > 0 then
  redis.call('HDEL', KEYS[2], unpack(terminal))
  local scores = {}
  for i, id in ipairs(terminal) do
    scores[2 * i - 1] = nowText
    scores[2 * i] = id
  end
  redis.call('ZADD', KEYS[3], unpack(scores))
end
if #counted > 0 then
  local counts = {}
  for i, id in ipairs(counted) do
    counts[2 * i - 1] = id
    counts[2 * i] = open[id]
  end
  redis.call('HSET', KEYS[2], unpack(counts))
end
return rows
