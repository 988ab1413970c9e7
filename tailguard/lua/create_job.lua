-- Store a new queued job.
-- KEYS[1] job hash
-- ARGV[1] JSON {ttl_s, queue_ttl_s, fields: {name: string value}}
-- -> submitted_at (expires_at = submitted_at + queue_ttl_s)
local a = cjson.decode(ARGV[1])
redis.call('HSET', KEYS[1], 'status', 'queued', 'submitted_at', string.format('%.6f', now),
           'expires_at', string.format('%.6f', now + a.queue_ttl_s))
for name, value in pairs(a.fields) do redis.call('HSET', KEYS[1], name, value) end
redis.call('EXPIRE', KEYS[1], a.ttl_s)
return string.format('%.6f', now)
