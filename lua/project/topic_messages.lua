#!lua flags=no-writes
-- project_topic_messages: one page of a topic's messages in publish order.
-- KEYS[1] topics  han:prj:{<env>:<pid>}:q:topics   HASH topicId -> topic JSON
-- KEYS[2] stream  han:prj:{<env>:<pid>}:t:<tid>:s  STREAM messages {p, c, d, z, a, b}
-- ARGV[1] topic id
-- ARGV[2] exclusive start: the last message id of the previous page, '' for the first page
-- ARGV[3] limit (1..100)
-- Returns {'ok', entries, more (1 | 0)} with entries as XRANGE answers them,
-- or {'topic_not_found'}.
-- Errors: "ERR data_state_invalid".
--#include key_types
if not keyTypesMatch({'hash', 'stream'}) then
  return redis.error_reply('ERR data_state_invalid')
end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  return {'topic_not_found'}
end
local start = '-'
if ARGV[2] ~= '' then
  start = '(' .. ARGV[2]
end
local limit = tonumber(ARGV[3])
local e = redis.call('XRANGE', KEYS[2], start, '+', 'COUNT', limit + 1)
local more = 0
if #e > limit then
  e[#e] = nil
  more = 1
end
return {'ok', e, more}
