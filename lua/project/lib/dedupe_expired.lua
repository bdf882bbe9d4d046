-- dedupeExpired returns up to `limit` identities of the dedupe records whose
-- expiry (score in the ddx ZSET) is at or before now, and the bytes their
-- records in the dd HASH hold in the budget's dd counter (an identity without
-- a record holds none). It returns nil when a record is malformed or the
-- bytes exceed dd: the data is inconsistent and the caller writes nothing.
-- It only reads, so read-only scripts use it to leave expired bytes out.
-- now and limit may be numbers or their decimal text.
local function dedupeExpired(ddKey, ddxKey, now, limit, dd)
  local ids = redis.call('ZRANGEBYSCORE', ddxKey, '-inf', now, 'LIMIT', '0', limit)
  local bytes = 0
  for _, id in ipairs(ids) do
    local raw = redis.call('HGET', ddKey, id)
    if raw then
      local ok, rec = pcall(cjson.decode, raw)
      if not ok or type(rec) ~= 'table' or type(rec.b) ~= 'number' then
        return nil
      end
      bytes = bytes + rec.b
    end
  end
  if bytes > dd then
    return nil
  end
  return ids, bytes
end
