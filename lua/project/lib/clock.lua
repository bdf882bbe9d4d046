-- clockNow reads the server clock and returns the time in ms as a number and
-- as its decimal text, built from TIME's own digits. Scripts pass numbers to
-- redis.call and into stored text as such text: Lua turns a number into text
-- with the C library's floating-point formatting, which costs more than many
-- of the commands that take it.
local function clockNow()
  local t = redis.call('TIME')
  local ms = math.floor(tonumber(t[2]) / 1000)
  return tonumber(t[1]) * 1000 + ms, t[1] .. string.format('%03d', ms)
end
-- decimal is the text of an integer the script computed (integer
-- formatting, much cheaper than Lua's own).
local function decimal(n)
  return string.format('%d', n)
end
