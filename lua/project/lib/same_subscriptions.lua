-- sameSubscriptions tells whether the topic's subscription SET holds exactly
-- the n ids the caller saw, passed in ARGV[offset + 1 .. offset + n]. The
-- caller named one key per subscription from that list, so when the set
-- changed in between it answers 'retry' and writes nothing. One SMEMBERS:
-- the caller's ids are distinct, so equal sizes and every member among them
-- mean the same set.
local function sameSubscriptions(tsubsKey, n, offset)
  local members = redis.call('SMEMBERS', tsubsKey)
  if #members ~= n then
    return false
  end
  if n == 1 then
    return members[1] == ARGV[offset + 1]
  end
  local seen = {}
  for i = 1, n do
    seen[ARGV[offset + i]] = true
  end
  for _, m in ipairs(members) do
    if not seen[m] then
      return false
    end
  end
  return true
end
