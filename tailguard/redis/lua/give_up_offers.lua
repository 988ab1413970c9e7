-- Offers past their deadline: each job's message leaves its worker's queue for its lane's, once.
-- ARGV[1] JSON {names: keys.OFFER_KEYS, limit} -> the ids of the jobs moved
-- LREM takes the message off the worker's queue only if no worker popped it yet: then (and only
-- then) it goes to the consuming end of its lane's queue (RPUSH: BRPOP pops that end; it waited
-- longest). A message a worker popped meanwhile is its: the offer counts as taken.
local a = cjson.decode(ARGV[1])
local k = a.names
local moved = {}
for _, job in ipairs(redis.call('ZRANGEBYSCORE', k.offers, '-inf', now, 'LIMIT', 0, a.limit)) do
  redis.call('ZREM', k.offers, job)
  local raw = redis.call('HGET', k.messages, job)
  redis.call('HDEL', k.messages, job)
  if raw then
    local e = cjson.decode(raw)  -- {worker, its queue, the lane's queue, the message}
    if redis.call('HINCRBY', k.offered, e[1], -1) <= 0 then redis.call('HDEL', k.offered, e[1]) end
    if redis.call('LREM', e[2], 1, e[4]) == 1 then
      redis.call('RPUSH', e[3], e[4])
      redis.call('HINCRBY', k.outcomes, 'given_up', 1)
      table.insert(moved, job)
    else
      redis.call('HINCRBY', k.outcomes, 'taken', 1)
    end
  end
end
return moved
