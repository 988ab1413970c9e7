"""A worker's heartbeat: it is alive, its lanes are served, its engine lives, dead peers are reaped."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis

from tailguard import settings
from tailguard.jobs.liveness import Liveness
from tailguard.jobs.reaper import LAPSE_PERIODS, Reaper

log = logging.getLogger("tailguard.worker")

#: How long `Heartbeat.stop` waits for a beat in progress (a Redis call past its timeout).
_JOIN_S = 5.0


def lapse_s() -> float:
    """How long a heartbeat written now stays valid."""
    return settings.WORKER_HEARTBEAT_S.get() * LAPSE_PERIODS


class Heartbeat:
    """Every `period_s`, on its own thread: this process (`hostname`) is alive (read by
    reapers), each of `checks` runs (an engine's death nobody saw), `advertise` says its
    lanes are served while its engine is (read by GET /healthz), and `reaper` reaps the
    running jobs of dead peers. `stop` ends the beats and says this process is gone."""

    def __init__(self, liveness: Liveness, hostname: str, period_s: float,
                 checks: list[Callable[[], None]], advertise: Callable[[], None],
                 reaper: Reaper) -> None:
        self.liveness, self.hostname, self.period_s = liveness, hostname, period_s
        self.checks, self.advertise, self.reaper = checks, advertise, reaper
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        #: time.monotonic() when the last beat ended, Redis answering or not (None: none yet):
        #: a stuck beat is what the worker's probe looks for (tailguard/worker/probe.py)
        self.last_beat: float | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="tailguard-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(_JOIN_S)  # a beat in progress must not mark it alive again
        try:
            self.liveness.forget_worker(self.hostname)
        except redis.RedisError:
            pass  # its heartbeat lapses on its own

    def run(self) -> None:
        while not self._stopping.is_set():
            self.beat()
            self._stopping.wait(self.period_s)

    def beat(self) -> None:
        """One heartbeat; a Redis error is logged and the next beat tries again."""
        try:
            self.liveness.worker_alive(self.hostname, ttl_s=lapse_s())
            for check in self.checks:
                check()
            self.advertise()
            self.reaper.run_once()
        except redis.RedisError as exc:
            log.warning("heartbeat failed: %s", exc)
        self.last_beat = time.monotonic()

    def age_s(self) -> float | None:
        """Seconds since the last beat ended (None: no beat yet)."""
        last = self.last_beat
        return None if last is None else time.monotonic() - last
