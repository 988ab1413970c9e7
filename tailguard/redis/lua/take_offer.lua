-- A worker started an offered job: its offer ends, taken (nothing if the offer lapsed first).
-- ARGV[1] JSON {names: keys.OFFER_KEYS, job} -> 1 if this call ended the offer, else 0
local a = cjson.decode(ARGV[1])
local k = a.names
if redis.call('ZREM', k.offers, a.job) == 0 then return 0 end
local raw = redis.call('HGET', k.messages, a.job)
redis.call('HDEL', k.messages, a.job)
if raw then
  local worker = cjson.decode(raw)[1]
  if redis.call('HINCRBY', k.offered, worker, -1) <= 0 then redis.call('HDEL', k.offered, worker) end
end
redis.call('HINCRBY', k.outcomes, 'taken', 1)
return 1
