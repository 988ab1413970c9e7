-- Store a new queued job and add it to its lane's backlog, in one step.
-- KEYS[1] job hash, KEYS[2] the lane's queued zset, KEYS[3] the lane's backlog (cost tokens)
-- ARGV[1] JSON {ttl_s, queue_ttl_s, cost, fields: {name: string value},
--               optional max_backlog_before, max_backlog_after: admission's limits}
-- -> submitted_at (expires_at = submitted_at + queue_ttl_s); or, when the backlog is past a
--    limit (requests admitted meanwhile by other API threads), {backlog} and nothing stored
local a = cjson.decode(ARGV[1])
local backlog = tonumber(redis.call('GET', KEYS[3]) or '0')
if (a.max_backlog_before and backlog > a.max_backlog_before)
    or (a.max_backlog_after and backlog + a.cost > a.max_backlog_after) then
  return {backlog}
end
local expires = now + a.queue_ttl_s
redis.call('HSET', KEYS[1], 'status', 'queued', 'submitted_at', string.format('%.6f', now),
           'expires_at', string.format('%.6f', expires))
for name, value in pairs(a.fields) do redis.call('HSET', KEYS[1], name, value) end
redis.call('EXPIRE', KEYS[1], a.ttl_s)
-- A member lapses at the job's expires_at (lane_load drops it), so a job nobody settles
-- leaves the backlog anyway; both keys outlive the last member.
redis.call('ZADD', KEYS[2], expires, a.cost .. ' ' .. KEYS[1])
redis.call('INCRBY', KEYS[3], a.cost)
local keep = math.ceil(a.queue_ttl_s) + 60
for i = 2, 3 do
  if redis.call('TTL', KEYS[i]) < keep then redis.call('EXPIRE', KEYS[i], keep) end
end
return string.format('%.6f', now)
