-- cacheSizes reads the sizes the sizes HASH records for relative keys (0 for
-- a key it has none of, and for a key named again: cacheForget has removed
-- its size by then), or returns nil when one is not a decimal integer as
-- HSET writes one (no sign or leading zero, at most 15 digits): data
-- no script wrote, so the caller refuses before its first write (a script
-- that fails halfway keeps the writes it made).
local function cacheSizes(sizesKey, members)
  local sizes = {}
  if #members == 0 then
    return sizes
  end
  local raw = redis.call('HMGET', sizesKey, unpack(members))
  local seen = {}
  for i = 1, #members do
    local v = raw[i]
    if v and (#v > 15 or not (v == '0' or string.find(v, '^[1-9]%d*$'))) then
      return nil
    end
    sizes[i] = seen[members[i]] and 0 or tonumber(v or '0')
    seen[members[i]] = true
  end
  return sizes
end

-- cacheForget removes relative keys from the cache's index, expiry and sizes
-- keys, and returns `bytes` less their sizes (as cacheSizes read them, before
-- any write) and how many of them the index held.
local function cacheForget(indexKey, expiryKey, sizesKey, members, sizes, bytes)
  local removed = 0
  for i, k in ipairs(members) do
    bytes = bytes - sizes[i]
    redis.call('HDEL', sizesKey, k)
    removed = removed + redis.call('ZREM', indexKey, k)
    redis.call('ZREM', expiryKey, k)
  end
  return bytes, removed
end
