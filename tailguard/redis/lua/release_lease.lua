-- Give up a lease (hold_lease.lua) if `owner` still holds it, so a process that stops hands it
-- over at once; one that lost it meanwhile must not delete its successor's.
-- KEYS[1] the lease; ARGV[1] JSON {owner}
-- -> 1 if it was released, 0 if another process holds it (or none does)
local a = cjson.decode(ARGV[1])
if redis.call('GET', KEYS[1]) == a.owner then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
