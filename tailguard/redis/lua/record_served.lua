-- Count one finished request's cost tokens in its lane's second; drop seconds past the window.
-- KEYS[1] the lane's served-per-second hash
-- ARGV[1] JSON {second, tokens, window_s}
local a = cjson.decode(ARGV[1])
redis.call('HINCRBY', KEYS[1], a.second, a.tokens)
local oldest = a.second - a.window_s - 1
for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
  if tonumber(f) < oldest then redis.call('HDEL', KEYS[1], f) end
end
redis.call('EXPIRE', KEYS[1], a.window_s * 2 + 1)
return 1
