-- Store a new queued job and add it to its lane's backlog, in one step.
-- KEYS[1] job hash, KEYS[2] the lane's queued zset, KEYS[3] the lane's backlog (cost tokens),
-- KEYS[4] the lane's running zset, optional KEYS[5] the lane's Celery queue (a list)
-- ARGV[1] JSON {ttl_s, queue_ttl_s, cost, fields: {name: string value},
--               optional slots, max_wait_tokens, max_backlog_after, sharing: admission's
--               limits (sharing: the running zsets of the lanes that take its slots too),
--               optional message: the job's Celery task message (tailguard/jobs/task_message.py),
--               pushed onto KEYS[5] with the record: one exists exactly when the other does,
--               optional only_new: store nothing when the job exists (a batch line's job id
--               is deterministic: a line queued again finds its job instead of running twice),
--               optional fair: {patterns: keys.FAIR_KEY_PATTERNS, lane, key, weight}: the lane
--               dispatches in fair order by key (fair_release.lua): the message is held in
--               the key's list and released in counter order, and a request past admission's
--               limits is still admitted within its key's fair share (admit_fairly),
--               optional offer: {keys: keys.OFFER_KEYS, job, worker, lane_queue, wait_s}: KEYS[5]
--               is that worker's own queue (prefix affinity: tailguard/jobs/prefix_index.py);
--               the offer is recorded with the message, lapsing wait_s from now}
-- -> submitted_at (expires_at = submitted_at + queue_ttl_s); or, when the lane is past a
--    limit (requests admitted meanwhile by other API threads), {backlog, queued, running,
--    sharing lanes' running} and nothing stored; 'exists' when only_new and the job exists
local a = cjson.decode(ARGV[1])
if a.only_new and redis.call('EXISTS', KEYS[1]) == 1 then return 'exists' end
local backlog, queued, running = lane_counts(KEYS[2], KEYS[3], KEYS[4])
local shared = a.sharing and sharing_count(a.sharing) or 0
local refuse = a.max_backlog_after and math.max(0, backlog) + a.cost > a.max_backlog_after
if a.max_wait_tokens and not refuse then
  -- AdmissionPolicy.wait_tokens (tailguard/lanes/admission.py): no wait while a free slot is left
  -- for it, else the queued work beyond the free slots plus one request's
  local free = math.max(0, a.slots - running - shared)
  if queued >= free then
    local work = a.cost
    if queued > 0 then work = work + math.max(0, backlog) * (queued - free) / queued end
    refuse = work > a.max_wait_tokens
  end
end
if refuse and a.fair then
  -- AdmissionPolicy.admit_fairly (tailguard/lanes/admission.py): while another key has work on
  -- the lane (held or running), a key within its weighted share of what the lane may hold
  -- queued and runs now, or one that counter order serves next (fair_share.served_next), is
  -- admitted, up to twice the bound
  local f = a.fair
  local counters = string.format(f.patterns.counters, f.lane)
  local work, held = {}, {}
  local h = redis.call('HGETALL', string.format(f.patterns.tokens, f.lane))
  for i = 1, #h, 2 do
    held[h[i]] = tonumber(h[i + 1])
    work[h[i]] = math.max(0, tonumber(h[i + 1]))
  end
  local running_total = 0
  local r = redis.call('HGETALL', string.format(f.patterns.running_tokens, f.lane))
  for i = 1, #r, 2 do
    local n = math.max(0, tonumber(r[i + 1]))
    work[r[i]] = (work[r[i]] or 0) + n
    running_total = running_total + n
  end
  local weights, active, least = f.weight, false, nil
  for k, n in pairs(work) do
    if k ~= f.key and n > 0 then
      active = true
      weights = weights + tonumber(redis.call('HGET', string.format(f.patterns.weights, f.lane), k) or '1')
      if (held[k] or 0) > 0 then
        local c = tonumber(redis.call('HGET', counters, k) or '0')
        if not least or c < least then least = c end
      end
    end
  end
  local capacity = math.min(a.max_backlog_after or math.huge, a.max_wait_tokens or math.huge)
      + running_total
  if active and not (a.max_backlog_after and math.max(0, backlog) + a.cost > 2 * a.max_backlog_after) then
    local mine = math.max(0, held[f.key] or 0)
    local first = false
    if least then
      local counter = tonumber(redis.call('HGET', counters, f.key) or '0')
      if mine <= 0 then counter = math.max(counter, least) end
      first = counter + mine / f.weight < least
    end
    if (work[f.key] or 0) + a.cost <= capacity * f.weight / weights or first then
      refuse = false
    end
  end
end
if refuse then return {backlog, queued, running, shared} end
local expires = now + a.queue_ttl_s
redis.call('HSET', KEYS[1], 'status', 'queued', 'submitted_at', string.format('%.6f', now),
           'expires_at', string.format('%.6f', expires))
for name, value in pairs(a.fields) do redis.call('HSET', KEYS[1], name, value) end
redis.call('EXPIRE', KEYS[1], a.ttl_s)
-- A member lapses at the job's expires_at (lane_counts drops it), so a job nobody settles
-- leaves the backlog anyway; both keys outlive the last member.
redis.call('ZADD', KEYS[2], expires, a.cost .. ' ' .. KEYS[1])
redis.call('INCRBY', KEYS[3], a.cost)
local keep = math.ceil(a.queue_ttl_s) + 60
if a.message and a.fair then
  fair_hold(a.fair.patterns, a.fair.lane, a.fair.key, a.fair.weight, KEYS[5], a.slots or 1, keep,
            a.cost, KEYS[1], a.message)
elseif a.message then
  redis.call('LPUSH', KEYS[5], a.message)
  if a.offer then
    local o = a.offer
    redis.call('ZADD', o.keys.offers, now + o.wait_s, o.job)
    redis.call('HSET', o.keys.messages, o.job, cjson.encode({o.worker, KEYS[5], o.lane_queue, a.message}))
    redis.call('HINCRBY', o.keys.offered, o.worker, 1)
    redis.call('HINCRBY', o.keys.outcomes, 'made', 1)
  end
end
for i = 2, 3 do
  if redis.call('TTL', KEYS[i]) < keep then redis.call('EXPIRE', KEYS[i], keep) end
end
return string.format('%.6f', now)
