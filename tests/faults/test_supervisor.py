"""The supervisor's restart path on real servers: Redis killed with SIGKILL comes back from
its AOF through `Group.supervise`, as `tailguard up` adopts and restarts it."""

from __future__ import annotations

import pytest
import redis

from tailguard.host.procs import Group, RestartPolicy, wait_until
from tailguard.host.redis_server import answers_ping, free_port, start_redis

pytestmark = pytest.mark.faults


def test_killed_redis_is_restarted_from_its_aof(tmp_path):
    port = free_port()
    with Group() as group:
        first = group.adopt(start_redis(port, tmp_path, restart=RestartPolicy(backoff_s=0.1)))
        client = redis.Redis(port=port, socket_timeout=5)
        client.set("accepted", "before the kill")
        first.kill()
        said = []
        wait_until(lambda: said.extend(group.supervise()) or group["redis"] is not first, [],
                   15, "redis restarted")
        assert "signal SIGKILL); restarting it in 0.1 s" in said[0]
        group.wait_until(lambda: answers_ping(port), 15, "redis answers again")
        assert client.get("accepted") == b"before the kill"  # the pool reconnected by itself
