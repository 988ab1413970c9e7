-- Move a batch from one of some statuses to another, stamping `<to>_at` (whole seconds of
-- the Redis clock, as OpenAI's timestamps are) and setting more fields, in one step: the
-- feeder and a cancelling API call never overwrite each other's status.
-- KEYS[1] the batch hash; ARGV[1] JSON {from: [status...], to, fields: {name: value}}
-- -> 1 if moved, 0 if the batch is in none of `from` (or gone)
local a = cjson.decode(ARGV[1])
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return 0 end
local ok = false
for _, s in ipairs(a.from) do if s == status then ok = true end end
if not ok then return 0 end
redis.call('HSET', KEYS[1], 'status', a.to, a.to .. '_at', tostring(math.floor(now)))
for name, value in pairs(a.fields) do redis.call('HSET', KEYS[1], name, value) end
return 1
