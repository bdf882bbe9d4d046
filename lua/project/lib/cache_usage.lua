-- cacheUsage checks the project cache's meta HASH against its index: without
-- meta no index, expiry or sizes key may exist; with it, cacheBytes is a
-- decimal integer (no sign, fraction, exponent or leading zero; at most 15
-- digits), and seq, where present, one at least the highest write seq in
-- the index.
-- Returns cacheBytes (0 without meta) and whether meta exists, or nil when
-- the structure is inconsistent: the caller then writes nothing.
local function cacheUsage(metaKey, indexKey, expiryKey, sizesKey)
  if redis.call('EXISTS', metaKey) == 0 then
    if redis.call('EXISTS', indexKey, expiryKey, sizesKey) > 0 then
      return nil
    end
    return 0, false
  end
  local m = redis.call('HMGET', metaKey, 'seq', 'cacheBytes')
  local top = redis.call('ZRANGE', indexKey, -1, -1, 'WITHSCORES')
  for i = 1, 2 do
    local v = m[i] or '0'
    if #v > 15 or not (v == '0' or string.find(v, '^[1-9]%d*$')) then
      return nil
    end
  end
  local bytes = tonumber(m[2] or '0')
  local seq = m[1] and tonumber(m[1])
  if (top[2] and (not seq or seq < tonumber(top[2]))) then
    return nil
  end
  return bytes, true
end
