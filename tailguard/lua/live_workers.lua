-- KEYS: lanes' zsets of workers -> the live member count of each (lapsed ones are dropped)
local out = {}
for i, k in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', k, '-inf', now)
  out[i] = redis.call('ZCARD', k)
end
return out
