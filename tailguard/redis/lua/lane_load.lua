-- A lane's load for admission: its figures (lane_counts) and the cost tokens it served over
-- the rate window.
-- KEYS[1] the lane's queued zset, KEYS[2] its backlog, KEYS[3] its running zset,
-- KEYS[4] its served-per-second hash, KEYS[5] its workers' zset (live_count): one round
-- trip for everything admission reads, on the request's path; KEYS[6] its workers' limits
-- (worker -> slots, heartbeat.lua), KEYS[7] its engine-milliseconds-per-second hash, KEYS[8..]
-- the running zsets of the lanes that share its slots (sharing_count)
-- ARGV[1] JSON {window_s}
-- -> {backlog tokens, queued jobs, running jobs, served tokens, now as text, live workers,
--     running jobs of the sharing lanes, the limits the live workers advertise summed, how
--     many advertise one, the engine milliseconds of the served tokens}
local a = cjson.decode(ARGV[1])
local backlog, queued, running = lane_counts(KEYS[1], KEYS[2], KEYS[3])
local since = math.floor(now - a.window_s)
local function in_window(key)
  local sum, h = 0, redis.call('HGETALL', key)
  for i = 1, #h, 2 do
    if tonumber(h[i]) >= since then sum = sum + tonumber(h[i + 1]) end
  end
  return sum
end
local served, served_ms = in_window(KEYS[4]), in_window(KEYS[7])
local live = live_count(KEYS[5])
local slots, advertised = 0, 0
if KEYS[6] and live > 0 then
  local workers = redis.call('ZRANGE', KEYS[5], 0, -1)
  for _, n in ipairs(redis.call('HMGET', KEYS[6], unpack(workers))) do
    if tonumber(n) then slots, advertised = slots + tonumber(n), advertised + 1 end
  end
end
local shared = sharing_count({unpack(KEYS, 8)})
return {backlog, queued, running, served, string.format('%.6f', now), live, shared, slots,
        advertised, served_ms}
