-- keyTypesMatch tells whether each of the first `count` KEYS (as many as
-- wants lists when count is nil) is missing or of the type the script
-- expects: wants[i], and past the end of wants the types of `each` in turn,
-- for the keys a script names per subscription. A key of another type is not
-- data the script was written for: the caller refuses and writes nothing.
local function keyTypesMatch(wants, count, each)
  for i = 1, count or #wants do
    local want = wants[i] or each[(i - #wants - 1) % #each + 1]
    local t = redis.call('TYPE', KEYS[i])['ok']
    if t ~= 'none' and t ~= want then
      return false
    end
  end
  return true
end
