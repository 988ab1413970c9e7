-- What prefix affinity reads at submit (tailguard/jobs/prefix_index.py), in one step.
-- KEYS[1] the running jobs (hash: job key -> worker), KEYS[2] the offers per worker (hash),
-- then per lane (a.lanes of them) its zset of workers (scored by when their heartbeat lapses)
-- and its hash of the workers' limits (worker -> slots), then a prompt's prefix keys (zsets of
-- the workers that served them, oldest first). ARGV[1] JSON {lanes, slots: each lane's limit
-- for a worker that advertised none}
-- -> {per lane {worker, load, slots, ...} for each of its live workers (load: jobs it runs +
--     offered to it), then per prefix key its workers live in any of the lanes, oldest first}
local a = cjson.decode(ARGV[1])
local load, live_in = {}, {}
for i = 1, a.lanes do
  live_in[i] = redis.call('ZRANGEBYSCORE', KEYS[1 + 2 * i], string.format('(%.6f', now), '+inf')
  for _, w in ipairs(live_in[i]) do load[w] = 0 end
end
for _, w in ipairs(redis.call('HVALS', KEYS[1])) do
  if load[w] then load[w] = load[w] + 1 end
end
for w, n in pairs(load) do load[w] = n + tonumber(redis.call('HGET', KEYS[2], w) or '0') end
local out = {}
for i = 1, a.lanes do
  local lane = {}
  for _, w in ipairs(live_in[i]) do
    table.insert(lane, w)
    table.insert(lane, load[w])
    table.insert(lane, tonumber(redis.call('HGET', KEYS[2 + 2 * i], w) or a.slots[i]))
  end
  table.insert(out, lane)
end
for k = 3 + 2 * a.lanes, #KEYS do
  local kept = {}
  for _, w in ipairs(redis.call('ZRANGE', KEYS[k], 0, -1)) do
    if load[w] then table.insert(kept, w) end
  end
  table.insert(out, kept)
end
return out
