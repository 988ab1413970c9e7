-- Prelude (after clock): a lane that dispatches in fair order by API key keeps its Celery list
-- about as deep as its free batch slots; the rest of its jobs wait in one held list per key and
-- are released here in virtual-token-counter order (tailguard/lanes/fair_share.py, the same
-- rule): the oldest job of the backlogged key with the least counter, its cost / weight added
-- to that counter. A held job no longer queued (cancelled) or past its queue TTL is dropped
-- instead (a reader settles a lapsed one as expired, as for a message that expired in the list).
-- f: keys.FAIR_KEY_PATTERNS (%s: the lane; held: the lane, then the key)
-- -> how many jobs were released
local function fair_release(f, lane)
  local fair = string.format(f.fair, lane)
  local queue = redis.call('HGET', fair, 'queue')
  if not queue then return 0 end
  local tokens, counters = string.format(f.tokens, lane), string.format(f.counters, lane)
  local slots = tonumber(redis.call('HGET', fair, 'slots')) or 1
  local depth = math.max(1, slots - redis.call('ZCARD', string.format(f.running, lane)))
  local released = 0
  while redis.call('LLEN', queue) < depth do
    local best, least
    for _, key in ipairs(redis.call('HKEYS', tokens)) do
      local c = tonumber(redis.call('HGET', counters, key) or '0')
      if not best or c < least or (c == least and key < best) then best, least = key, c end
    end
    if not best then break end
    local list = string.format(f.held, lane, best)
    local entry = redis.call('LPOP', list)
    if entry then
      local cost, job, message = string.match(entry, '^(%d+) (%S+) (.*)$')
      cost = tonumber(cost)
      redis.call('HINCRBY', tokens, best, -cost)
      local status = redis.call('HGET', job, 'status')
      local expires = tonumber(redis.call('HGET', job, 'expires_at'))
      if status == 'queued' and expires and expires > now then
        redis.call('LPUSH', queue, message)
        local weight = tonumber(redis.call('HGET', string.format(f.weights, lane), best) or '1')
        redis.call('HINCRBYFLOAT', counters, best, cost / weight)
        redis.call('HSET', fair, 'last_served', best)
        released = released + 1
      end
    end
    if redis.call('LLEN', list) == 0 then redis.call('HDEL', tokens, best) end
  end
  return released
end

-- Hold a new job of `key` on a fair lane (its record is stored), then release what fits.
-- A key with nothing held is lifted to the least counter of the backlogged keys (to the last
-- served key's when none is), never lowered: credit is not saved up while idle.
local function fair_hold(f, lane, key, weight, queue, slots, ttl_s, cost, job, message)
  local fair = string.format(f.fair, lane)
  local tokens, counters = string.format(f.tokens, lane), string.format(f.counters, lane)
  local weights, list = string.format(f.weights, lane), string.format(f.held, lane, key)
  redis.call('HSET', fair, 'queue', queue, 'slots', slots)
  if redis.call('LLEN', list) == 0 then
    local floor
    for _, other in ipairs(redis.call('HKEYS', tokens)) do
      if other ~= key then
        local c = tonumber(redis.call('HGET', counters, other) or '0')
        if not floor or c < floor then floor = c end
      end
    end
    local last = redis.call('HGET', fair, 'last_served')
    if not floor and last and last ~= key then
      floor = tonumber(redis.call('HGET', counters, last) or '0')
    end
    if floor and floor > tonumber(redis.call('HGET', counters, key) or '0') then
      redis.call('HSET', counters, key, floor)
    end
  end
  redis.call('RPUSH', list, cost .. ' ' .. job .. ' ' .. message)
  redis.call('HINCRBY', tokens, key, cost)
  redis.call('HSET', weights, key, weight)
  for _, k in ipairs({fair, tokens, counters, weights, list}) do
    if redis.call('TTL', k) < ttl_s then redis.call('EXPIRE', k, ttl_s) end
  end
  return fair_release(f, lane)
end
