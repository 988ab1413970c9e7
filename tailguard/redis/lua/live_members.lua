-- KEYS[1] a zset of members scored by when they lapse -> the members that have not lapsed
-- (lapsed ones are dropped)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZRANGE', KEYS[1], 0, -1)
