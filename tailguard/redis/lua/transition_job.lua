-- Compare-and-set of a job's state; a terminal state also ends the job's stream and
-- announces the job on the stream of finished jobs, in the same atomic step. The index of
-- running jobs follows in that step too: a job enters it with its worker when it starts
-- running and leaves it with any other state; so does its lane's running zset (admission's
-- slots in use), which a job enters only when its worker serves its lane (a live member of
-- the lane's workers: a worker that no longer advertises the lane takes no slot of it),
-- scored by when the API would settle it as worker_lost.
-- KEYS[1] job hash, KEYS[2] its stream, KEYS[3] the stream of finished jobs,
-- KEYS[4] the running jobs' index (job key -> worker)
-- ARGV[1] JSON {
--   from: [state, ...]       move only from one of these
--   to: state                the new state; `<to>_at` is stamped with `now`
--   overdue_field, grace_s   optional: move only if now > the job's overdue_field + grace_s
--   fresh_field              optional: move only if now <= the job's fresh_field (a worker
--                            starting a job: not once its queue TTL has passed)
--   return_record            optional: when moved, also return the job's fields after the move
--   end_event                optional: terminal event data (a JSON text) for the job's stream
--   record_ttl_s, output_ttl_s       with end_event: how long the record and the stream (the
--                                    job's text) are kept from now
--   stream_maxlen, finished_maxlen   approximate caps of the two streams
--   fields: {name: string value}     set with the new state
--   lane_keys: {queued, backlog, running, workers}   the lane key names with %s for the
--                                    lane (keys.py): a job leaving `queued` leaves its lane's
--                                    backlog
--   worker_lost_grace_s              with lane_keys: a running job lapses from its lane's
--                                    running zset this long past now + its deadline_s
--   fair                             with lane_keys: keys.FAIR_KEY_PATTERNS: a job of a lane
--                                    that dispatches in fair order moved, so a slot or a place
--                                    in its Celery list may have freed: release held jobs
--                                    (fair_release.lua)
-- }
-- -> {1, previous state[, the job's fields as HGETALL lists them]} when moved;
--    {0, current state} when not (false if no such job); {0, current state, 'overdue'} when
--    fresh_field has passed
local a = cjson.decode(ARGV[1])
local cur = redis.call('HGET', KEYS[1], 'status')
if not cur then return {0, false} end
local allowed = false
for _, s in ipairs(a.from) do if s == cur then allowed = true end end
if not allowed then return {0, cur} end
if a.overdue_field then
  local since = tonumber(redis.call('HGET', KEYS[1], a.overdue_field))
  if not since or now <= since + a.grace_s then return {0, cur} end
end
if a.fresh_field then
  local fresh_until = tonumber(redis.call('HGET', KEYS[1], a.fresh_field))
  if fresh_until and now > fresh_until then return {0, cur, 'overdue'} end
end
redis.call('HSET', KEYS[1], 'status', a.to, a.to .. '_at', string.format('%.6f', now))
if cur == 'queued' and a.lane_keys then
  local lane, cost = redis.call('HGET', KEYS[1], 'lane'), redis.call('HGET', KEYS[1], 'cost')
  -- ZREM says whether it was still counted (lane_load may have dropped it as lapsed)
  if lane and cost and redis.call('ZREM', string.format(a.lane_keys.queued, lane),
                                  cost .. ' ' .. KEYS[1]) == 1 then
    redis.call('DECRBY', string.format(a.lane_keys.backlog, lane), cost)
  end
end
for name, value in pairs(a.fields) do redis.call('HSET', KEYS[1], name, value) end
local lane = a.lane_keys and redis.call('HGET', KEYS[1], 'lane')
if a.to == 'running' then
  local worker = redis.call('HGET', KEYS[1], 'worker')
  redis.call('HSET', KEYS[4], KEYS[1], worker or '')
  if lane then
    local running = string.format(a.lane_keys.running, lane)
    local serves = worker and redis.call('ZSCORE', string.format(a.lane_keys.workers, lane), worker)
    if serves and tonumber(serves) > now then
      local lapse = (tonumber(redis.call('HGET', KEYS[1], 'deadline_s')) or 0) + a.worker_lost_grace_s
      redis.call('ZADD', running, now + lapse, KEYS[1])
      if redis.call('TTL', running) < lapse + 60 then
        redis.call('EXPIRE', running, math.ceil(lapse) + 60)
      end
    else
      redis.call('ZREM', running, KEYS[1])
    end
  end
elseif cur == 'running' then
  redis.call('HDEL', KEYS[4], KEYS[1])
  if lane then redis.call('ZREM', string.format(a.lane_keys.running, lane), KEYS[1]) end
end
if lane and a.fair and a.to ~= cur and (a.to == 'running' or cur == 'running') then
  -- what each key runs on a fair lane (fair admission counts it with what the key has held):
  -- the job keeps what it added (fair_running), so it is taken out whatever became of the
  -- lane's fair hash meanwhile (it lapses after a lull)
  local key, tokens = redis.call('HGET', KEYS[1], 'api_key'), string.format(a.fair.running_tokens, lane)
  local counted = tonumber(redis.call('HGET', KEYS[1], 'fair_running'))
  if counted and key then
    if redis.call('HINCRBY', tokens, key, -counted) <= 0 then redis.call('HDEL', tokens, key) end
    redis.call('HDEL', KEYS[1], 'fair_running')
  end
  local cost = tonumber(redis.call('HGET', KEYS[1], 'cost'))
  if a.to == 'running' and key and cost
     and redis.call('HEXISTS', string.format(a.fair.fair, lane), 'queue') == 1 then
    redis.call('HINCRBY', tokens, key, cost)
    redis.call('HSET', KEYS[1], 'fair_running', cost)
    if redis.call('TTL', tokens) < 3600 then redis.call('EXPIRE', tokens, 86400) end
  end
end
if lane and a.fair then fair_release(a.fair, lane) end
if a.end_event then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', a.stream_maxlen, '*', 'type', 'end', 'data', a.end_event)
  redis.call('EXPIRE', KEYS[1], a.record_ttl_s)
  redis.call('EXPIRE', KEYS[2], a.output_ttl_s)
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', a.finished_maxlen, '*', 'key', KEYS[1])
end
if a.return_record then return {1, cur, redis.call('HGETALL', KEYS[1])} end
return {1, cur}
