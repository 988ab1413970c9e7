-- Prelude (after clock): the live members of a zset scored by when each lapses (a lane's
-- workers, by heartbeat), lapsed ones dropped first.
local function live_count(key)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  return redis.call('ZCARD', key)
end
