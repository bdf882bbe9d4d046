#!lua
-- project_topic_ack: record a receipt's outcome (processed | failed),
-- fenced by the lease token in the same script that acknowledges (unlike a
-- bare XACK, which accepts any consumer's ack). The current lease's token
-- before leaseUntil acknowledges; the same token again with the same status
-- and result is an idempotent replay, with another one a conflict; a token
-- of an earlier lease of this receipt, or the current one after its lease
-- ended, is lease_expired; any other token lease_token_mismatch. Pausing
-- does not matter here: valid leases can always be acknowledged.
-- KEYS[1] subs      han:prj:{<env>:<pid>}:q:subs     HASH subscriptionId -> subscription JSON
-- KEYS[2] open      han:prj:{<env>:<pid>}:t:<tid>:o  HASH messageId -> receipts not yet terminal
-- KEYS[3] done      han:prj:{<env>:<pid>}:t:<tid>:d  ZSET messages terminal for every subscription
-- KEYS[4] receipts  han:prj:{<env>:<pid>}:s:<sid>:r  HASH messageId -> receipt JSON {s, a, l, u, r, h}
-- KEYS[5] leases    han:prj:{<env>:<pid>}:s:<sid>:l  ZSET leaseUntil ms -> messageId
-- ARGV[1] subscription id
-- ARGV[2] its topic id
-- ARGV[3] message id
-- ARGV[4] hex hash of the presented token
-- ARGV[5] status: processed | failed
-- ARGV[6] result (may be empty)
-- Returns {'ok', receipt JSON, applied (1 | 0 for a replay)} or, with
-- nothing written, {'subscription_not_found' | 'message_not_found' |
-- 'lease_expired' | 'lease_token_mismatch' | 'receipt_conflict'}.
-- Structure: the subs, receipts and open keys are read before any write,
-- the done key is checked with TYPE when the ack will write it, and the
-- first write is the ZREM of the leases key; on a key of the wrong type
-- that command fails (WRONGTYPE, which the caller maps to
-- data_state_invalid) with nothing written.
-- Errors: "ERR data_state_invalid" and WRONGTYPE (nothing written).
--#include subscription
--#include clock
-- A subscription's receipts go with it (the scripts that delete it delete
-- them), so a receipt shows the subscription exists; its record is decoded
-- only when there is none, to tell the two outcomes apart.
local known = redis.call('HEXISTS', KEYS[1], ARGV[1])
local r = redis.call('HGET', KEYS[4], ARGV[3])
if not r or known == 0 then
  local sub = readSubscription(KEYS[1], ARGV[1])
  if sub == nil then
    return redis.error_reply('ERR data_state_invalid')
  end
  if not sub or sub.topicId ~= ARGV[2] then
    return {'subscription_not_found'}
  end
  return {'message_not_found'}
end
-- A leased receipt has one form, built as text by the claim: it is read
-- without decoding. Any other text is decoded and checked.
local rec
local aText, lText, h = r:match('^{"s":"leased","a":(%d+),"l":(%d+),"u":%d+,"h":"([%x,]*)"}$')
if aText then
  rec = {s = 'leased', a = tonumber(aText), l = tonumber(lText), h = h}
else
  local ok
  ok, rec = pcall(cjson.decode, r)
  if not ok or type(rec) ~= 'table' or type(rec.s) ~= 'string' or type(rec.l) ~= 'number' or type(rec.a) ~= 'number' or
    (rec.h ~= nil and (type(rec.h) ~= 'string' or not rec.h:find('^[%x,]*$'))) then
    return redis.error_reply('ERR data_state_invalid')
  end
  aText, lText = decimal(rec.a), decimal(rec.l)
end

-- The hashes of the tokens the receipt issued, the current one last.
local current, earlier = nil, false
if rec.h and rec.h:find('^%x+$') then
  current = rec.h
elseif rec.h then
  local hashes = {}
  for x in string.gmatch(rec.h, '[^,]+') do
    table.insert(hashes, x)
  end
  current = hashes[#hashes]
  for i = 1, #hashes - 1 do
    if hashes[i] == ARGV[4] then
      earlier = true
    end
  end
end
local now, nowText = clockNow()

if rec.s == 'processed' or rec.s == 'failed' then
  if current == ARGV[4] then
    if rec.s == ARGV[5] and (rec.r or '') == ARGV[6] then
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
  if earlier or current == ARGV[4] then
    return {'lease_expired'}
  end
  return {'lease_token_mismatch'}
end
if rec.s ~= 'leased' then
  -- pending: no token was ever issued
  return {'lease_token_mismatch'}
end
if earlier or (current == ARGV[4] and now >= rec.l) then
  return {'lease_expired'}
end
if current ~= ARGV[4] then
  return {'lease_token_mismatch'}
end
local c = tonumber(redis.call('HGET', KEYS[2], ARGV[3]) or '0')
if c == nil or c < 1 then
  return redis.error_reply('ERR data_state_invalid')
end
if c <= 1 then
  local kt = redis.call('TYPE', KEYS[3])['ok']
  if kt ~= 'none' and kt ~= 'zset' then
    return redis.error_reply('ERR data_state_invalid')
  end
end

-- Writes; the first one fails on a leases key of another type.
redis.call('ZREM', KEYS[5], ARGV[3])
-- The record is built as text (as the claim builds it): the hex hashes and
-- the numbers need no escaping, nor do processed and failed; any other
-- status and a non-empty result are encoded.
local st = (ARGV[5] == 'processed' or ARGV[5] == 'failed') and '"' .. ARGV[5] .. '"' or cjson.encode(ARGV[5])
r = '{"s":' .. st .. ',"a":' .. aText .. ',"l":' .. lText .. ',"u":' .. nowText ..
  ',"r":' .. (ARGV[6] == '' and '""' or cjson.encode(ARGV[6])) .. ',"h":"' .. (rec.h or '') .. '"}'
redis.call('HSET', KEYS[4], ARGV[3], r)
if c <= 1 then
  redis.call('HDEL', KEYS[2], ARGV[3])
  redis.call('ZADD', KEYS[3], nowText, ARGV[3])
else
  redis.call('HINCRBY', KEYS[2], ARGV[3], '-1')
end
return {'ok', r, 1}
