-- cacheForget removes relative keys from the cache's index, expiry and sizes
-- keys, and returns `bytes` less their recorded sizes and how many of them
-- the index held.
local function cacheForget(indexKey, expiryKey, sizesKey, members, bytes)
  local removed = 0
  for _, k in ipairs(members) do
    bytes = bytes - tonumber(redis.call('HGET', sizesKey, k) or '0')
    redis.call('HDEL', sizesKey, k)
    removed = removed + redis.call('ZREM', indexKey, k)
    redis.call('ZREM', expiryKey, k)
  end
  return bytes, removed
end
