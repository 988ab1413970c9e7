-- Prelude of the scripts that read a lane's load (after clock): its figures as admission
-- counts them, lapsed members dropped first. A queued job lapses at its expires_at and
-- leaves the backlog with its cost; a running one lapses when the API would settle it as
-- worker_lost, so a job whose record vanished cannot stay counted.
-- -> backlog (cost tokens queued), queued jobs, running jobs (on the lane's own workers)
local function lane_counts(queued_key, backlog_key, running_key)
  local lapsed = redis.call('ZRANGEBYSCORE', queued_key, '-inf', now)
  for _, m in ipairs(lapsed) do
    redis.call('DECRBY', backlog_key, tonumber(string.match(m, '^(%d+) ')))
  end
  if #lapsed > 0 then redis.call('ZREMRANGEBYSCORE', queued_key, '-inf', now) end
  redis.call('ZREMRANGEBYSCORE', running_key, '-inf', now)
  return tonumber(redis.call('GET', backlog_key) or '0'), redis.call('ZCARD', queued_key),
         redis.call('ZCARD', running_key)
end

-- The running jobs of other lanes that take this lane's slots (LaneTable.sharing), their
-- lapsed members dropped first, as lane_counts drops the lane's own.
local function sharing_count(running_keys)
  local n = 0
  for _, key in ipairs(running_keys) do
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
    n = n + redis.call('ZCARD', key)
  end
  return n
end
