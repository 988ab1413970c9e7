-- What prefix affinity reads at submit (tailguard/jobs/prefix_index.py), in one step.
-- KEYS[1] the lane's zset of workers (scored by when their heartbeat lapses), KEYS[2] the
-- running jobs (hash: job key -> worker), KEYS[3] the offers per worker (hash), KEYS[4..] a
-- prompt's prefix keys (zsets of the workers that served them, oldest first)
-- -> {{worker, load, ...} for each live worker of the lane (load: jobs it runs + offered to it),
--     then per prefix key its live workers, oldest first}
local live = {}
for _, w in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], string.format('(%.6f', now), '+inf')) do
  live[w] = 0
end
for _, w in ipairs(redis.call('HVALS', KEYS[2])) do
  if live[w] then live[w] = live[w] + 1 end
end
local loads = {}
for w, n in pairs(live) do
  table.insert(loads, w)
  table.insert(loads, n + tonumber(redis.call('HGET', KEYS[3], w) or '0'))
end
local out = {loads}
for i = 4, #KEYS do
  local kept = {}
  for _, w in ipairs(redis.call('ZRANGE', KEYS[i], 0, -1)) do
    if live[w] then table.insert(kept, w) end
  end
  table.insert(out, kept)
end
return out
