-- A lane's load for admission: its backlog (lapsed members dropped first) and the cost
-- tokens it served over the rate window.
-- KEYS[1] the lane's queued zset, KEYS[2] its backlog, KEYS[3] its served-per-second hash
-- ARGV[1] JSON {window_s}
-- -> {backlog tokens, served tokens, now as text}
local a = cjson.decode(ARGV[1])
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
for _, m in ipairs(lapsed) do
  redis.call('DECRBY', KEYS[2], tonumber(string.match(m, '^(%d+) ')))
end
if #lapsed > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now) end
local served, since = 0, math.floor(now - a.window_s)
local h = redis.call('HGETALL', KEYS[3])
for i = 1, #h, 2 do
  if tonumber(h[i]) >= since then served = served + tonumber(h[i + 1]) end
end
return {tonumber(redis.call('GET', KEYS[2]) or '0'), served, string.format('%.6f', now)}
