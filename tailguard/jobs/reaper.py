"""Ends, within seconds, the running jobs of a worker that stopped heart-beating.

A worker killed with -9 (or frozen, or cut off from Redis) leaves its running jobs
"running", and Celery does not rescue them (the Redis visibility timeout is ~a day
here, and task_reject_on_worker_lost acts under prefork only). Every worker process
refreshes its own heartbeat (tailguard/jobs/liveness.py) and every running job is indexed
with its worker (``keys.RUNNING_JOBS``, kept by the transition script), so a reaper
pass fails each indexed job whose worker has lapsed, as ``worker_lost``, whether or
not any client reads it; the failing transition announces it on the finished stream.

The same passes put back on their queue the messages a worker took but lost with
its broker connection before starting them (tailguard/jobs/redeliver.py), when given a
Redeliverer: both are what a lost worker or connection leaves behind.

Delivery: a reaped job is failed, never requeued. It may have streamed text, and
even one that streamed nothing may have reached the engine of a worker that is only
cut off: running it again could run it twice. The client sees ``worker_lost`` and
may resubmit.

A worker counts as gone only when two passes, at least one heartbeat period
apart, both find it lapsed: after a Redis stall every heartbeat looks lapsed at
once, and a live worker gets one period to refresh its own before its jobs are
touched. Any number of reapers may run (the API's, every worker's): the
transition is a compare-and-set, so each job is ended, and counted, once.

With heartbeat period p (TAILGUARD_WORKER_HEARTBEAT_S) a heartbeat lapses 3p
after it was written, so a dead worker's jobs end at most ~5p after it died
(lapse 3p, seen by a pass within p, confirmed a pass later).
"""

from __future__ import annotations

import logging
import threading
import time

import redis

from tailguard.errors import WorkerLost
from tailguard.jobs.liveness import Liveness
from tailguard.jobs.redeliver import Redeliverer
from tailguard.jobs.store import FAILED, RUNNING, JobStore

log = logging.getLogger("tailguard.reaper")

#: A heartbeat lapses this many periods after it was written.
LAPSE_PERIODS = 3


class Reaper:
    """Reaps the running jobs of lapsed workers; `run_once` is one pass (not thread-safe:
    one Reaper per loop)."""

    def __init__(self, store: JobStore, liveness: Liveness, period_s: float,
                 redeliverer: Redeliverer | None = None) -> None:
        self.store = store
        self.liveness = liveness
        self.period_s = period_s
        self.redeliverer = redeliverer
        self._suspects: dict[str, float] = {}  # worker -> when a pass first found it lapsed

    def run_once(self) -> list[str]:
        """One pass; returns the ids of the jobs this pass ended."""
        if self.redeliverer is not None:
            try:
                self.redeliverer.run_once()
            except Exception as exc:  # noqa: BLE001 - kombu's and redis' errors alike; retried
                log.warning("redelivery pass: %s", exc)
        running = self.store.running()
        if not running:
            self._suspects.clear()
            return []
        alive = self.liveness.alive_workers()
        now = time.monotonic()
        lapsed = {w for w in running.values() if w not in alive}
        self._suspects = {w: self._suspects.get(w, now) for w in lapsed}
        gone = {w for w, since in self._suspects.items() if now - since >= self.period_s}
        reaped = []
        for job_id, worker in running.items():
            if worker not in gone:
                continue
            moved, before = self.store.transition(job_id, {RUNNING}, FAILED, {"error": WorkerLost(
                f"its worker {worker} stopped heart-beating while running it").to_dict()})
            if moved:
                reaped.append(job_id)
                log.warning("job %s failed: its worker %s stopped heart-beating", job_id, worker)
            elif before is None:
                self.store.unindex(job_id)
        return reaped

    def run_forever(self, stop: threading.Event) -> None:
        """A pass every period until `stop` is set; Redis errors are logged and retried."""
        while not stop.is_set():
            try:
                self.run_once()
            except redis.RedisError as exc:
                log.warning("reaper: %s", exc)
            stop.wait(self.period_s)

    def start(self, stop: threading.Event | None = None) -> threading.Thread:
        """Run passes on a daemon thread (the API's reaper)."""
        thread = threading.Thread(target=self.run_forever, args=(stop or threading.Event(),),
                                  name="tailguard-reaper", daemon=True)
        thread.start()
        return thread
