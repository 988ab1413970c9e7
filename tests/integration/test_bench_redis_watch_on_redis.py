"""The bench's Redis watch sees a Redis that blocked, from Redis's own latency monitor."""

import pytest

from tailguard.bench.redis_watch import RedisWatch

pytestmark = pytest.mark.integration

# a script that keeps Redis's one thread busy for about 150 ms (no command returns meanwhile)
BUSY_150MS = """local t = redis.call('TIME'); local start = t[1] * 1e6 + t[2]
repeat t = redis.call('TIME') until t[1] * 1e6 + t[2] - start > 150000
return 1"""


def test_a_blocked_redis_is_reported_and_a_quiet_one_is_not(redis_server, redis_client):
    quiet = RedisWatch(redis_server)
    redis_client.ping()
    assert quiet.stop()["latency_events_ms"] == {}

    watch = RedisWatch(redis_server)  # clears what came before
    redis_client.eval(BUSY_150MS, 0)
    seen = watch.stop()
    assert seen["latency_events_ms"].get("command", 0) >= 100
    assert seen["slow_commands"] >= 1 and seen["slowest_ms"] >= 100
    assert seen["slowest_command"].lower() == "eval"
