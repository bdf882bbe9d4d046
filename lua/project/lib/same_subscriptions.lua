-- sameSubscriptions tells whether the topic's subscription SET holds exactly
-- the n ids the caller saw, passed in ARGV[offset + 1 .. offset + n]. The
-- caller named one key per subscription from that list, so when the set
-- changed in between it answers 'retry' and writes nothing.
local function sameSubscriptions(tsubsKey, n, offset)
  if redis.call('SCARD', tsubsKey) ~= n then
    return false
  end
  for i = 1, n do
    if redis.call('SISMEMBER', tsubsKey, ARGV[offset + i]) == 0 then
      return false
    end
  end
  return true
end
