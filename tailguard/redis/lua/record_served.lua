-- Count one finished request's cost tokens, and the engine milliseconds it ran, in its lane's
-- second; drop seconds past the window.
-- KEYS[1] the lane's served-per-second hash, KEYS[2] its engine-milliseconds-per-second hash
-- ARGV[1] JSON {second, tokens, engine_ms, window_s}
local a = cjson.decode(ARGV[1])
local oldest = a.second - a.window_s - 1
for i, key in ipairs(KEYS) do
  redis.call('HINCRBY', key, a.second, i == 1 and a.tokens or a.engine_ms)
  for _, f in ipairs(redis.call('HKEYS', key)) do
    if tonumber(f) < oldest then redis.call('HDEL', key, f) end
  end
  redis.call('EXPIRE', key, a.window_s * 2 + 1)
end
return 1
