#!lua
-- project_topic_publish: publish one or more messages to a topic, in
-- order, each as if it were a script of its own (a later item sees what an
-- earlier one wrote: the same identity twice is a replay of the first).
-- Idempotent per identity (topic, producerId, clientEventId) within the
-- dedupe window: the same canonical payload returns the stored message, a
-- different one is a conflict. Every subscription existing now gets a
-- pending receipt, and its reservation is charged now, so a claim never
-- fails on budget. Reads and checks come first, then the writes: the purge
-- of expired dedupe records (they are gone whatever the outcome), reported
-- in the first item's `purged` on every path after the checks, and for new
-- messages the messages, their receipts, their dedupe records and the
-- counters, one command per key for all items but the XADDs.
-- Structure: the first access of every key is a read, or for the stream
-- the XADD that is the first write, so a key of the wrong type fails that
-- command (WRONGTYPE, which the caller maps to data_state_invalid) before
-- anything is written; the open or done key and each receipts key, which
-- are otherwise only written, are checked with TYPE before the first write.
-- KEYS[1] topics   han:prj:{<env>:<pid>}:q:topics     HASH topicId -> topic JSON
-- KEYS[2] budget   han:prj:{<env>:<pid>}:q:budget     HASH msg, rcpt, dd (reliable bytes), tb:<tid> (message bytes of a topic)
-- KEYS[3] dd       han:prj:{<env>:<pid>}:q:dd         HASH identity -> dedupe JSON {m, f, a, z, b, x}
-- KEYS[4] ddx      han:prj:{<env>:<pid>}:q:ddx        ZSET identity -> expiresAt ms
-- KEYS[5] stream   han:prj:{<env>:<pid>}:t:<tid>:s    STREAM messages {p, c, d, z, a, b}
-- KEYS[6] tsubs    han:prj:{<env>:<pid>}:t:<tid>:subs SET subscription ids
-- KEYS[7] open     han:prj:{<env>:<pid>}:t:<tid>:o    HASH messageId -> receipts not yet terminal
-- KEYS[8] done     han:prj:{<env>:<pid>}:t:<tid>:d    ZSET publishedAt -> messageId terminal for every subscription
-- KEYS[9..] one receipts HASH han:prj:{<env>:<pid>}:s:<sid>:r per subscription, in ARGV[7..] order
-- ARGV[1] topic id
-- ARGV[2] project budget in bytes
-- ARGV[3] bytes reserved per receipt
-- ARGV[4] dedupe window in ms
-- ARGV[5] how many expired dedupe records to purge at most
-- ARGV[6] number of subscriptions n the caller saw
-- ARGV[7..6+n] their ids
-- then eight per message:
--   identity (topicId "\n" producerId "\n" clientEventId), fingerprint of
--   the canonical payload (hex SHA-256), producerId, clientEventId,
--   canonical payload, message bytes (what the message costs of the
--   budget, stored in its entry as b: trim releases it), dedupe record
--   bytes, bytes reserved on the module budget for this message
-- Returns one row per message, {outcome, messageId, publishedAt, added,
-- purged}: outcome is 'created' (added = bytes charged), 'replay'
-- (messageId/publishedAt of the stored message), 'conflict', 'budget'
-- (project budget), 'module' (needs more than reserved), or, for every
-- message with nothing written, 'topic_not_found' and 'retry' (the
-- subscriptions changed).
-- Errors: "ERR data_state_invalid" and WRONGTYPE (nothing written).
--#include topic_budget
--#include dedupe_expired
--#include dedupe_purge
--#include same_subscriptions
--#include clock
local n = tonumber(ARGV[6])
local base = 6 + n
local m = (#ARGV - base) / 8
if m < 1 or m ~= math.floor(m) then
  return redis.error_reply('ERR publish items')
end
local function every(outcome)
  local rows = {}
  for j = 1, m do
    rows[j] = {outcome, '', 0, 0, 0}
  end
  return rows
end
local tid = ARGV[1]
local msg, rcpt, dd, tb = topicBudget(KEYS[2], tid)
if not msg then
  return redis.error_reply('ERR data_state_invalid')
end
if redis.call('HEXISTS', KEYS[1], tid) == 0 then
  if redis.call('EXISTS', KEYS[5], KEYS[6], KEYS[7], KEYS[8]) > 0 then
    return redis.error_reply('ERR data_state_invalid')
  end
  return every('topic_not_found')
end
-- Every message holds at least 2 bytes, so messages without counted bytes
-- (the budget missing or emptied) are data the script did not write.
if msg == 0 and redis.call('XLEN', KEYS[5]) > 0 then
  return redis.error_reply('ERR data_state_invalid')
end
if not sameSubscriptions(KEYS[6], n, 6) then
  return every('retry')
end

local now, nowText = clockNow()
local expired, purged = dedupeExpired(KEYS[3], KEYS[4], nowText, ARGV[5], dd)
if not expired then
  return redis.error_reply('ERR data_state_invalid')
end
local identities = {}
for j = 1, m do
  identities[j] = ARGV[base + 8 * j - 7]
end
local stored = redis.call('HMGET', KEYS[3], unpack(identities))
local purging = {}
for _, id in ipairs(expired) do
  purging[id] = true
end
local budget, per, window = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local used = msg + rcpt + dd - purged
-- replaced: the bytes of expired dedupe records beyond this call's purge
-- whose identity is published again; the new record overwrites each, so
-- its bytes leave the dd counter with it.
local replaced = 0
-- Outcomes first. created[identity] is the row of a message this call
-- creates (its id is set by the XADD below).
local rows, created, news = {}, {}, {}
local size, ddBytes = 0, 0
for j = 1, m do
  local a = base + 8 * j - 8
  local identity = ARGV[a + 1]
  local live = created[identity]
  local row
  local old = 0
  if live then
    row = live.f == ARGV[a + 2] and {'replay', live.row} or {'conflict', '', 0, 0, 0}
  elseif stored[j] then
    local ok, rec = pcall(cjson.decode, stored[j])
    if not ok or type(rec) ~= 'table' or type(rec.x) ~= 'number' then
      return redis.error_reply('ERR data_state_invalid')
    elseif rec.x > now then
      row = rec.f == ARGV[a + 2] and {'replay', rec.m, rec.a, 0, 0} or {'conflict', '', 0, 0, 0}
    elseif not purging[identity] then
      if type(rec.b) ~= 'number' then
        return redis.error_reply('ERR data_state_invalid')
      end
      old = rec.b
    end
  end
  if not row then
    local cost, b = tonumber(ARGV[a + 6]), tonumber(ARGV[a + 7])
    local need = cost + b + n * per
    if used - old + need > budget then
      row = {'budget', '', 0, 0, 0}
    elseif need > tonumber(ARGV[a + 8]) then
      row = {'module', '', 0, 0, 0}
    else
      used, size, ddBytes, replaced = used - old + need, size + cost, ddBytes + b, replaced + old
      row = {'created', '', now, need, 0}
      created[identity] = {f = ARGV[a + 2], row = row}
      -- The entry's z is the payload's bytes (the message's sizeBytes).
      table.insert(news, {a, row, tostring(#ARGV[a + 5])})
    end
  end
  rows[j] = row
end

if #news > 0 then
  -- The keys only written below are checked first.
  local want = n > 0 and {KEYS[7], 'hash'} or {KEYS[8], 'zset'}
  local kt = redis.call('TYPE', want[1])['ok']
  if kt ~= 'none' and kt ~= want[2] then
    return redis.error_reply('ERR data_state_invalid')
  end
  for i = 1, n do
    kt = redis.call('TYPE', KEYS[8 + i])['ok']
    if kt ~= 'none' and kt ~= 'hash' then
      return redis.error_reply('ERR data_state_invalid')
    end
  end
  -- The first write: on a stream key of another type it fails, writing
  -- nothing. Numbers go to Redis and into records as text (clockNow); the
  -- ARGV ones as the caller sent them.
  for _, x in ipairs(news) do
    local a = x[1]
    x[2][2] = redis.call('XADD', KEYS[5], '*', 'p', ARGV[a + 3], 'c', ARGV[a + 4], 'd', ARGV[a + 5], 'z', x[3], 'a', nowText,
      'b', ARGV[a + 6])
  end
end
dedupePurge(KEYS[3], KEYS[4], expired)
-- A replay of a message created above answers with its id.
for j = 1, m do
  local row = rows[j]
  if row[1] == 'replay' and type(row[2]) == 'table' then
    rows[j] = {'replay', row[2][2], now, 0, row[5] or 0}
  end
end
rows[1][5] = purged
if #news == 0 then
  if purged > 0 then
    redis.call('HINCRBY', KEYS[2], 'dd', -purged)
  end
  return rows
end

local pending = '{"s":"pending","a":0,"l":0,"u":' .. nowText .. ',"h":""}'
local receipts, marks, records, expiries = {}, {}, {}, {}
local x = decimal(now + window)
local nText = ARGV[6]
for i, y in ipairs(news) do
  local a, id = y[1], y[2][2]
  receipts[2 * i - 1], receipts[2 * i] = id, pending
  if n > 0 then
    marks[2 * i - 1], marks[2 * i] = id, nText
  else
    marks[2 * i - 1], marks[2 * i] = nowText, id
  end
  -- The record is built as text: every value is a number, the stream id or
  -- the hex fingerprint, none of which needs escaping in JSON.
  records[2 * i - 1] = ARGV[a + 1]
  records[2 * i] = '{"m":"' .. id .. '","f":"' .. ARGV[a + 2] .. '","a":' .. nowText .. ',"z":' .. y[3] ..
    ',"b":' .. ARGV[a + 7] .. ',"x":' .. x .. '}'
  expiries[2 * i - 1], expiries[2 * i] = x, ARGV[a + 1]
end
for i = 1, n do
  redis.call('HSET', KEYS[8 + i], unpack(receipts))
end
if n > 0 then
  redis.call('HSET', KEYS[7], unpack(marks))
else
  redis.call('ZADD', KEYS[8], unpack(marks))
end
redis.call('HSET', KEYS[3], unpack(records))
redis.call('ZADD', KEYS[4], unpack(expiries))
redis.call('HSET', KEYS[2], 'msg', decimal(msg + size), 'tb:' .. tid, decimal(tb + size), 'rcpt', decimal(rcpt + #news * n * per),
  'dd', decimal(dd - purged - replaced + ddBytes))
return rows
