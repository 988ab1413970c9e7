-- A batch line ended: its output or error line written, unless it has one of either already
-- (two feeders a lease apart may collect one line, one seeing it succeed, the other refused:
-- a custom_id is in one of the batch's files, once), and it leaves the pending and retry
-- hashes, in one step.
-- KEYS[1] output, KEYS[2] errors, KEYS[3] pending, KEYS[4] retry (keys.batch_lines_key),
-- KEYS[5] the batch hash
-- ARGV[1] JSON {index, line, ok, next_index (optional: the batch's cursor past it)}
-- -> 1 when its line was written, 0 when it had one
local a = cjson.decode(ARGV[1])
local index = tostring(a.index)
local written = 0
if redis.call('HEXISTS', KEYS[1], index) == 0 and redis.call('HEXISTS', KEYS[2], index) == 0 then
  redis.call('HSET', a.ok and KEYS[1] or KEYS[2], index, a.line)
  written = 1
end
redis.call('HDEL', KEYS[3], index)
redis.call('HDEL', KEYS[4], index)
if a.next_index then redis.call('HSET', KEYS[5], 'next', a.next_index) end
return written
