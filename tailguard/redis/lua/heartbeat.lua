-- A worker is alive for a lane until now + ttl_s.
-- KEYS[1] the lane's zset of workers; optional KEYS[2] the lane's hash of the workers' limits
-- (worker -> slots), written with a.slots, the fields of workers no longer live dropped here
-- (readers drop lapsed members from KEYS[1] as they read)
-- ARGV[1] JSON {worker, ttl_s, slots?}
local a = cjson.decode(ARGV[1])
local keep = math.ceil(a.ttl_s) * 2
if KEYS[2] then
  for _, w in ipairs(redis.call('HKEYS', KEYS[2])) do
    local lapses = redis.call('ZSCORE', KEYS[1], w)
    if not lapses or tonumber(lapses) <= now then redis.call('HDEL', KEYS[2], w) end
  end
  redis.call('HSET', KEYS[2], a.worker, a.slots)
  redis.call('EXPIRE', KEYS[2], keep)
end
redis.call('ZADD', KEYS[1], now + a.ttl_s, a.worker)
redis.call('EXPIRE', KEYS[1], keep)
return 1
