-- storedCount reads a count or size a script stored in a HASH field as
-- HINCRBY and HSET write one: a missing field (false) is 0; "0" or a
-- decimal integer without sign or leading zero, of at most 15 digits (exact
-- as a Lua number), is its value. Any other text ("1.5", "1e3", "-1", "",
-- "007", 20 digits) is nil: data no script wrote, which the caller refuses
-- before its first write (HINCRBY on it would fail halfway).
local function storedCount(v)
  if not v then
    return 0
  end
  if #v > 15 or not (v == '0' or string.find(v, '^[1-9]%d*$')) then
    return nil
  end
  return tonumber(v)
end
