#!lua
-- rt_index_remove: remove members from a dead instance's connection index
-- only if their score is still the one the sweep read (compare and
-- delete): an instance that came back and listed a connection again gave
-- it a newer score, and that entry stays.
-- KEYS[1] connection index han:rt:instance:{<instance_id>}:connections
-- ARGV pairs: member, score the sweep read (integer milliseconds as text)
-- Returns the number of members removed.
local removed = 0
for i = 1, #ARGV, 2 do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) == tonumber(ARGV[i + 1]) then
    removed = removed + redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
return removed
