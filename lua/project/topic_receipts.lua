#!lua flags=no-writes
-- project_topic_receipts: one page of a subscription's receipts in message
-- order. Every message published after the subscription's creation (its
-- `from` position) has a receipt of it until trim removes both.
-- KEYS[1] subs      han:prj:{<env>:<pid>}:q:subs     HASH subscriptionId -> subscription JSON
-- KEYS[2] stream    han:prj:{<env>:<pid>}:t:<tid>:s  STREAM messages
-- KEYS[3] receipts  han:prj:{<env>:<pid>}:s:<sid>:r  HASH messageId -> receipt JSON {s, a, l, u, r, h}
-- ARGV[1] subscription id
-- ARGV[2] its topic id
-- ARGV[3] exclusive start: the last message id of the previous page, '' for the first page
-- ARGV[4] limit (1..100)
-- Returns {'ok', now, {messageId, receipt JSON, ...}, more (1 | 0)} or
-- {'subscription_not_found'}.
-- Errors: "ERR data_state_invalid".
--#include key_types
--#include subscription
if not keyTypesMatch({'hash', 'stream', 'hash'}) then
  return redis.error_reply('ERR data_state_invalid')
end
local sub = readSubscription(KEYS[1], ARGV[1], 'from')
if sub == nil then
  return redis.error_reply('ERR data_state_invalid')
end
if not sub or sub.topicId ~= ARGV[2] then
  return {'subscription_not_found'}
end
-- Stream ids "<ms>-<seq>": the later of the cursor and `from`. Both parts
-- are decimal text without leading zeros of up to 20 digits, compared as
-- text (by length, then digit by digit): a Lua number holds 2^53 exactly,
-- not 2^64.
local function greater(x, y)
  if #x ~= #y then
    return #x > #y
  end
  return x > y
end
local function later(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if not am or not bm then
    return b
  end
  if greater(am, bm) or (am == bm and greater(as, bs)) then
    return a
  end
  return b
end
local start = sub.from
if ARGV[3] ~= '' then
  start = later(ARGV[3], sub.from)
end
local limit = tonumber(ARGV[4])
local e = redis.call('XRANGE', KEYS[2], '(' .. start, '+', 'COUNT', limit + 1)
local more = 0
if #e > limit then
  e[#e] = nil
  more = 1
end
local out = {}
for _, x in ipairs(e) do
  local r = redis.call('HGET', KEYS[3], x[1])
  if not r then
    return redis.error_reply('ERR data_state_invalid')
  end
  table.insert(out, x[1])
  table.insert(out, r)
end
local t = redis.call('TIME')
return {'ok', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), out, more}
