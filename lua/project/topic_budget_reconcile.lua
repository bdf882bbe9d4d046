#!lua
-- project_topic_budget_reconcile: the periodic job that brings the module
-- budget counter back to the sum of the project budgets (it drifts upward
-- only: a crash between the phases leaves bytes counted). Two steps around
-- the caller's scan of the project budgets:
--   begin: refuse when another reconcile is running (younger than ARGV[3]);
--          drop reservations older than ARGV[2] (their instance died) and
--          leases past their expiry (their instance died or went idle; the
--          bytes its scripts added are in the project budgets the scan
--          sums, and a live instance commits them again when it returns the
--          lease, which only over-counts); their bytes move to committed,
--          since the project scripts may have used them: until end (or
--          when end never comes) the counter over-counts, never under;
--          bump gen, open the window (rstart = now, rpos = 0).
--   end:   if the window is still ours (gen = ARGV[2]), committed = the
--          scanned sum + every byte committed during the window (rpos:
--          a write settled while the scan ran may or may not be in the
--          sum; counting it twice only over-counts), close the window,
--          bump gen (so releases read before it are not subtracted again).
--          When the scan could not read some project's budget (ARGV[4] =
--          1), the sum holds an allowance for it in place of its unknown
--          bytes, and committed is never raised on that account: it becomes
--          the smaller of the two values, both of which never under-count.
--   prune: between begin and end, for the ids the scan read with nothing
--          held (budget missing or all zero): each leaves the projects SET
--          when its last stamp (the time of the last reservation or lease
--          call that named it, which stamps and adds it in the same script)
--          is older than the window's start minus ARGV[3], the longest a
--          write may still add bytes after such a call. Then every write
--          the id's stamp allowed ended before the window opened, so before
--          the scan read the id, and a write the scan could have missed has
--          a newer stamp and keeps the id. An id without a stamp (added
--          before stamps existed) is stamped now and kept. Only while the
--          window is ours (gen = ARGV[2]): a newer window's start may
--          follow the read.
-- Never under-counts, so the budget never over-admits.
-- KEYS[1] budget    han:prj:{<env>:module}:budget    HASH committed, reserved, leased, gen, rstart, rpos
-- KEYS[2] resv      han:prj:{<env>:module}:resv      HASH reservation id -> "<amount>:<created ms>"
-- KEYS[3] leases    han:prj:{<env>:module}:leases    HASH lease id -> "<amount>:<expires ms>"
-- KEYS[4] projects  han:prj:{<env>:module}:projects  SET project ids holding reliable bytes (what the scan sums)
-- KEYS[5] seen      han:prj:{<env>:module}:seen      HASH project id -> ms of the last call that named it
-- ARGV[1] 'begin' | 'end' | 'prune'
-- begin: ARGV[2] reservation age in ms after which it is dropped,
--        ARGV[3] window age in ms after which a running reconcile is presumed dead
-- end:   ARGV[2] gen returned by begin, ARGV[3] the scanned sum in bytes,
--        ARGV[4] 1 when some project was unreadable (committed is not raised), else 0
-- prune: ARGV[2] gen returned by begin, ARGV[3] grace in ms, ARGV[4..] project ids read empty
-- Returns begin: {1, gen, dropped reservations and leases} | {0}; end: {1, committed before, committed after} | {0};
-- prune: {1, ids removed} | {0}.
-- Errors: "ERR data_state_invalid" (nothing written).
--#include key_types
--#include count
if not keyTypesMatch({'hash', 'hash', 'hash', 'set', 'hash'}) then
  return redis.error_reply('ERR data_state_invalid')
end
local b = redis.call('HMGET', KEYS[1], 'committed', 'reserved', 'gen', 'rstart', 'rpos', 'leased')
for i = 1, 6 do
  if not storedCount(b[i]) then
    return redis.error_reply('ERR data_state_invalid')
  end
end
local committed, reserved = tonumber(b[1] or '0'), tonumber(b[2] or '0')
local gen, rstart, rpos, leased = tonumber(b[3] or '0'), tonumber(b[4] or '0'), tonumber(b[5] or '0'), tonumber(b[6] or '0')
if not (committed and reserved and gen and rstart and rpos and leased) then
  return redis.error_reply('ERR data_state_invalid')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[1] == 'begin' then
  if rstart > 0 and now - rstart < tonumber(ARGV[3]) then
    return {0}
  end
  -- Reservations older than the age and leases past their expiry go; both
  -- are "<bytes>:<ms>" fields, and a malformed one goes too.
  local function drop(key, before)
    local all = redis.call('HGETALL', key)
    local bytes, n = 0, 0
    for i = 1, #all, 2 do
      local amount, at = string.match(all[i + 1], '^(%d+):(%d+)$')
      if not amount or tonumber(at) < before then
        redis.call('HDEL', key, all[i])
        bytes = bytes + (tonumber(amount) or 0)
        n = n + 1
      end
    end
    return bytes, n
  end
  local rbytes, rn = drop(KEYS[2], now - tonumber(ARGV[2]))
  local lbytes, ln = drop(KEYS[3], now)
  reserved = math.max(reserved - rbytes, 0)
  leased = math.max(leased - lbytes, 0)
  committed = committed + rbytes + lbytes
  local dropped = rn + ln
  gen = gen + 1
  redis.call('HSET', KEYS[1], 'reserved', reserved, 'leased', leased, 'gen', gen, 'rstart', now, 'rpos', 0,
    'committed', committed)
  return {1, gen, dropped}
end
if rstart == 0 or gen ~= tonumber(ARGV[2]) then
  return {0}
end
if ARGV[1] == 'prune' then
  local before, removed = rstart - tonumber(ARGV[3]), 0
  for i = 4, #ARGV do
    local id = ARGV[i]
    local stamp = redis.call('HGET', KEYS[5], id)
    if not stamp or not tonumber(stamp) then
      redis.call('HSET', KEYS[5], id, string.format('%d', now))
    elseif tonumber(stamp) < before then
      removed = removed + redis.call('SREM', KEYS[4], id)
      redis.call('HDEL', KEYS[5], id)
    end
  end
  return {1, removed}
end
local after = tonumber(ARGV[3]) + rpos
if ARGV[4] == '1' and committed < after then
  after = committed
end
redis.call('HSET', KEYS[1], 'committed', after, 'gen', gen + 1, 'rstart', 0, 'rpos', 0)
return {1, committed, after}
