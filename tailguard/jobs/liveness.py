"""Which workers are alive, and which serve which lane, now.

Two heartbeats, both members of sorted sets scored by when they lapse, on the
Redis clock:

* per worker process (``keys.WORKERS``): refreshed while the process runs,
  engine up or not; the reaper (tailguard/jobs/reaper.py) ends the running jobs of a
  worker that lapsed.
* per lane (``keys.lane_workers_key``): refreshed only while the worker's engine
  is up and warm; what GET /healthz reads. A worker withdraws it the moment its
  engine dies and advertises again once a new engine has warmed up.

A worker that stops withdraws its members; one that dies lapses after a few
missed periods. Readers drop lapsed members as they read.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping

import redis

from tailguard.redis import keys, lua


class Liveness:
    """Worker heartbeats per lane in one Redis; stateless apart from the client."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client
        self._heartbeat = lua.Script(client, "clock", "heartbeat")
        self._live = lua.Script(client, "clock", "live_count", "live_workers")
        self._members = lua.Script(client, "clock", "live_members")

    def heartbeat(self, lanes: list[str], worker: str, ttl_s: float,
                  slots: Mapping[str, int] | None = None) -> None:
        """Mark `worker` as serving `lanes` for the next `ttl_s` seconds, with `slots` (lane ->
        its per-engine limit there, which prefix affinity reads) where given."""
        for lane in lanes:
            if slots is not None and lane in slots:
                self._heartbeat([keys.lane_workers_key(lane), keys.lane_worker_slots_key(lane)],
                                worker=worker, ttl_s=ttl_s, slots=slots[lane])
            else:
                self._heartbeat([keys.lane_workers_key(lane)], worker=worker, ttl_s=ttl_s)

    def forget(self, lanes: list[str], worker: str) -> None:
        """Withdraw `worker` from `lanes` at once (a clean stop need not wait for the lapse)."""
        for lane in lanes:
            self.redis.zrem(keys.lane_workers_key(lane), worker)
            self.redis.hdel(keys.lane_worker_slots_key(lane), worker)

    def worker_alive(self, worker: str, ttl_s: float) -> None:
        """Mark the `worker` process as alive for the next `ttl_s` seconds."""
        self._heartbeat([keys.WORKERS], worker=worker, ttl_s=ttl_s)

    def forget_worker(self, worker: str) -> None:
        """A clean stop: `worker` is gone now (it has no running job left to reap)."""
        self.redis.zrem(keys.WORKERS, worker)

    def alive_workers(self) -> set[str]:
        """The worker processes whose heartbeat has not lapsed."""
        return {m.decode() if isinstance(m, bytes) else m for m in self._members([keys.WORKERS])}

    def live_workers(self, lanes: list[str]) -> dict[str, int]:
        """How many workers serve each lane now."""
        counts = self._live([keys.lane_workers_key(l) for l in lanes])
        return dict(zip(lanes, (int(c) for c in counts)))

    def live_workers_per_host(self, lanes: list[str]) -> dict[str, dict[str, int]]:
        """For each lane, how many of its live workers run on each host (see `host_of`):
        a fleet spread over machines shows which machine's workers a lane is down to."""
        per_lane = {}
        for lane in lanes:
            hosts: collections.Counter[str] = collections.Counter()
            for member in self._members([keys.lane_workers_key(lane)]):
                hosts[host_of(member.decode() if isinstance(member, bytes) else member)] += 1
            per_lane[lane] = dict(sorted(hosts.items()))
        return per_lane


def node_name(worker: str) -> str:
    """The Celery node name a tailguard worker runs under: its name (a lane's, or its
    [[workers]] entry's) then Celery's ``%h`` (the host name, expanded by the worker), so Flower,
    ``celery inspect`` and `host_of` tell hosts apart: ``short`` -> ``short@%h`` -> ``short@gpu-a``."""
    if not worker or "@" in worker:
        raise ValueError(f"a worker name is neither empty nor holds '@' (Celery's separator): {worker!r}")
    return f"{worker}@%h"


def host_of(worker: str) -> str:
    """The host of a Celery worker name (``short@gpu-host-2`` -> ``gpu-host-2``); a name
    without ``@`` is its own host."""
    return worker.rpartition("@")[2]


def lane_health(liveness: Liveness, lanes: list[str]) -> tuple[bool, dict]:
    """Healthy when Redis answers and every lane has a live worker with its engine up
    (anywhere: a lane served only by workers on other hosts is as healthy as a local one)."""
    per_host = liveness.live_workers_per_host(lanes)
    live = {lane: sum(hosts.values()) for lane, hosts in per_host.items()}
    missing = [lane for lane, n in live.items() if n == 0]
    return not missing, {"status": "ok" if not missing else "degraded", "redis": "ok",
                         "workers_per_lane": live, "workers_per_host": per_host,
                         "lanes_without_worker": missing}
