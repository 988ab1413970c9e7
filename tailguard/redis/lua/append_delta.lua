-- Append one batch of a job's output to its stream (its text, or an OpenAI job's chunks or
-- response). The stream gets `ttl_s` only while it has no expiry of its own (just created):
-- once the job has ended, its transition gave the stream the output's TTL, which a late write
-- (a batch flushed just after a cancel) must not stretch.
-- KEYS[1] the job's stream
-- ARGV[1] JSON {id, type, data, maxlen, ttl_s}: the entry's explicit id (0-k: the writer's k-th),
--              its type (delta when absent), its data (JSON text), the stream's approximate cap,
--              its TTL when new
-- -> the entry id, or XADD's own error (an id at or below the stream's top: it landed
--    before, or the stream has ended)
local a = cjson.decode(ARGV[1])
local added = redis.pcall('XADD', KEYS[1], 'MAXLEN', '~', a.maxlen, a.id,
                          'type', a.type or 'delta', 'data', a.data)
if type(added) == 'table' and added.err then return added end
if redis.call('TTL', KEYS[1]) < 0 then redis.call('EXPIRE', KEYS[1], a.ttl_s) end
return added
