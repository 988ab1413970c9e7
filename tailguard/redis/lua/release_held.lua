-- Release a fair lane's held jobs that fit its Celery list now (fair_release): the redelivery
-- pass's backstop, for a slot freed without a job transition (a skipped message).
-- ARGV[1] JSON {fair: keys.FAIR_KEY_PATTERNS, lane}
-- -> how many jobs were released
local a = cjson.decode(ARGV[1])
return fair_release(a.fair, a.lane)
