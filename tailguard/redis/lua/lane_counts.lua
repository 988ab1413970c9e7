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
