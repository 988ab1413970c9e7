-- Take or renew a lease that one process at a time holds (the redelivery passes'), so that
-- every process may run the loop and only one does its work.
-- KEYS[1] the lease; ARGV[1] JSON {owner, ttl_ms}
-- -> 1 if `owner` holds it now (taken, or renewed for ttl_ms), 0 while another holder's lasts
local a = cjson.decode(ARGV[1])
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= a.owner then return 0 end
redis.call('SET', KEYS[1], a.owner, 'PX', a.ttl_ms)
return 1
