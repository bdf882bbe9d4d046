#!lua
-- rt_offline: the debounced offline transition. When the user has no live
-- connection left, delete the online marker; the caller publishes the
-- transition only when this call deleted it, so it goes out once. A check
-- may be run again when its reply was lost (a timeout, while Redis may
-- still run it): the check that deleted the marker leaves its token, and
-- the same check run again answers went_offline=1 again.
-- KEYS[1] user ZSET        han:rt:user:{<user_id>}:connections
-- KEYS[2] online marker    han:rt:user:{<user_id>}:online
-- KEYS[3] offline record   han:rt:user:{<user_id>}:offline (optional):
--         the token of the check that deleted the marker
-- ARGV[1] connection HASH TTL in ms (older members are stale, not live)
-- ARGV[2] the check's token (with KEYS[3]), unique per scheduled check
-- ARGV[3] offline record TTL in ms (with KEYS[3]; the online marker's TTL)
-- ARGV[4] the time in ms of the disconnect that scheduled the check
--         (optional): the transition's time, unless the online marker
--         (which holds the time of the user's latest registration or
--         refresh) is later. Then a connection came (on any instance)
--         after that disconnect and has gone since, and the transition's
--         time is now: later than the online transition it ends, whatever
--         instance reported that. Without ARGV[4], or when it is later
--         than now (a time read on another node's clock: a check handed
--         on from a dead instance's index), it is now as well.
-- Returns {went_offline, now_ms, at_ms}; at_ms (the transition's time) only
-- when went_offline is 1. The record keeps "<token>:<at_ms>", so a check
-- run again reports the same time.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = redis.call('ZCOUNT', KEYS[1], string.format('%d', now - tonumber(ARGV[1])), '+inf')
if live > 0 then
  return {0, now}
end
local mark = redis.call('GET', KEYS[2])
if mark then
  redis.call('DEL', KEYS[2])
  local at = tonumber(ARGV[4]) or now
  if (tonumber(mark) or 0) > at or at > now then
    at = now
  end
  if KEYS[3] then
    redis.call('SET', KEYS[3], ARGV[2] .. ':' .. string.format('%d', at), 'PX', ARGV[3])
  end
  return {1, now, at}
end
if KEYS[3] then
  local rec = redis.call('GET', KEYS[3])
  local prefix = ARGV[2] .. ':'
  if rec and string.sub(rec, 1, #prefix) == prefix then
    return {1, now, tonumber(string.sub(rec, #prefix + 1))}
  end
end
return {0, now}
