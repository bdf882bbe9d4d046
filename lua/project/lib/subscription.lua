-- readSubscription reads subscription sid from the subs HASH. Returns the
-- decoded table and its stored JSON; false when there is none; nil when the
-- JSON is not an object or, with stringField, lacks that string field (the
-- caller answers data_state_invalid and writes nothing).
local function readSubscription(subsKey, sid, stringField)
  local raw = redis.call('HGET', subsKey, sid)
  if not raw then
    return false
  end
  local ok, sub = pcall(cjson.decode, raw)
  if not ok or type(sub) ~= 'table' or (stringField and type(sub[stringField]) ~= 'string') then
    return nil
  end
  return sub, raw
end
