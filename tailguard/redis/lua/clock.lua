-- Prelude of the scripts that stamp times: `now` is the Redis server clock in seconds,
-- so every stamp comes from one clock, never the API's or a worker's.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
