-- Add one finished request to its minute's histograms and, with `slow`, to the minute's
-- slowest requests (only the `keep` slowest stay); with `key`, to its API key's minute too
-- (the same histograms, and the output tokens it was served on its lane), the key's name
-- added to the minute's set of keys.
-- KEYS[1] stats hash, KEYS[2] slow zset, KEYS[3] the key's stats hash, KEYS[4] the minute's keys
-- ARGV[1] JSON {
--   ttl_s, status,
--   metrics: {name: [value as text, bucket]},
--   slow: optional {member, score, keep},
--   key: optional {name, lane, tokens}
-- }
local a = cjson.decode(ARGV[1])

local function add(h)
  redis.call('HINCRBY', h, 'n', 1)
  redis.call('HINCRBY', h, 'status:' .. a.status, 1)
  for m, vb in pairs(a.metrics) do
    local text, v = vb[1], tonumber(vb[1])
    redis.call('HINCRBY', h, m .. ':b' .. vb[2], 1)
    redis.call('HINCRBY', h, m .. ':n', 1)
    redis.call('HINCRBYFLOAT', h, m .. ':sum', text)
    local cur = tonumber(redis.call('HGET', h, m .. ':max'))
    if not cur or v > cur then redis.call('HSET', h, m .. ':max', text) end
    local low = tonumber(redis.call('HGET', h, m .. ':min'))
    if not low or v < low then redis.call('HSET', h, m .. ':min', text) end
  end
  redis.call('EXPIRE', h, a.ttl_s)
end

add(KEYS[1])
if a.key then
  add(KEYS[3])
  redis.call('HINCRBY', KEYS[3], 'served:' .. a.key.lane, a.key.tokens)
  redis.call('SADD', KEYS[4], a.key.name)
  redis.call('EXPIRE', KEYS[4], a.ttl_s)
end
if a.slow then
  redis.call('ZADD', KEYS[2], a.slow.score, a.slow.member)
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, -(a.slow.keep + 1))
  redis.call('EXPIRE', KEYS[2], a.ttl_s)
end
return 1
