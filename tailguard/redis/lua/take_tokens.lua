-- Token buckets of one caller, taken from together or not at all.
-- KEYS[1] the caller's buckets (a hash: <name>:level, <name>:at)
-- ARGV[1] JSON {buckets: [{name, capacity, per_s, take}, ...]}
--   a bucket holds at most `capacity`, refills `per_s` a second, starts full
-- -> {1, 0} taken; {0, seconds until all could be taken} when some bucket is short
local a = cjson.decode(ARGV[1])
local levels, wait = {}, 0
for i, b in ipairs(a.buckets) do
  local level = tonumber(redis.call('HGET', KEYS[1], b.name .. ':level') or b.capacity)
  local at = tonumber(redis.call('HGET', KEYS[1], b.name .. ':at') or now)
  level = math.min(b.capacity, level + (now - at) * b.per_s)
  levels[i] = level
  if level < b.take then wait = math.max(wait, (b.take - level) / b.per_s) end
end
local longest = 0
for _, b in ipairs(a.buckets) do longest = math.max(longest, b.capacity / b.per_s) end
if wait > 0 then
  return {0, string.format('%.3f', wait)}
end
for i, b in ipairs(a.buckets) do
  redis.call('HSET', KEYS[1], b.name .. ':level', string.format('%.6f', levels[i] - b.take),
             b.name .. ':at', string.format('%.6f', now))
end
-- an untouched bucket is full again after capacity / per_s: the hash need not outlive that
redis.call('EXPIRE', KEYS[1], math.ceil(longest) + 1)
return {1, '0'}
