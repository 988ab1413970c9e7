"""A worker's heartbeat: it is alive, its lanes are served, its engine lives, dead peers are reaped."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import redis

from tailguard import settings
from tailguard.jobs.reaper import LAPSE_PERIODS, Reaper
from tailguard.jobs.redeliver import Redeliverer

if TYPE_CHECKING:
    from tailguard.worker.runtime import WorkerRuntime

log = logging.getLogger("tailguard.worker")


def lapse_s() -> float:
    """How long a heartbeat written now stays valid."""
    return settings.WORKER_HEARTBEAT_S.get() * LAPSE_PERIODS


def run_heartbeat(runtime: WorkerRuntime) -> None:
    """Every period: this process is alive (read by reapers), its lanes are served while
    its engine is (read by GET /healthz), its engine is checked for a death nobody saw,
    and the running jobs of dead peers are reaped."""
    period = settings.WORKER_HEARTBEAT_S.get()
    reaper = Reaper(runtime.store, runtime.liveness, period,
                    Redeliverer(runtime.store, runtime.app.connection_for_write,
                                settings.REDELIVER_AFTER_S.get(), runtime.lanes, confirm_s=period))
    while not runtime.stopping.is_set():
        try:
            runtime.liveness.worker_alive(runtime.hostname, ttl_s=lapse_s())
            runtime.keeper.check()
            if runtime.idle_keeper is not None:
                runtime.idle_keeper.check()
            runtime.advertise()
            reaper.run_once()
        except redis.RedisError as exc:
            log.warning("heartbeat failed: %s", exc)
        runtime.stopping.wait(period)
