-- A worker is alive for a lane until now + ttl_s.
-- KEYS[1] the lane's zset of workers; ARGV[1] JSON {worker, ttl_s}
local a = cjson.decode(ARGV[1])
redis.call('ZADD', KEYS[1], now + a.ttl_s, a.worker)
redis.call('EXPIRE', KEYS[1], math.ceil(a.ttl_s) * 2)
return 1
