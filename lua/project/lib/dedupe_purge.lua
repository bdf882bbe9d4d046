-- dedupePurge removes the dedupe records that dedupeExpired listed from the dd
-- HASH and the ddx ZSET. Releasing their bytes from the budget's dd counter is
-- left to the caller, next to its other budget releases.
local function dedupePurge(ddKey, ddxKey, ids)
  for _, id in ipairs(ids) do
    redis.call('HDEL', ddKey, id)
    redis.call('ZREM', ddxKey, id)
  end
end
