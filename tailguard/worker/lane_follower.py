"""A worker that changes lanes without restarting its engine.

The lane controller (tailguard/control/controller.py) writes each worker's order to
Redis (tailguard/jobs/lane_orders.py); the follower reads this worker's order every
period and, when it names other lanes, carries it out with the engine left warm:

1. **stop**: withdraw the old lanes' heartbeat (admission stops counting this worker's
   slots there at once) and stop consuming their queues (Celery's ``cancel_task_queue``,
   run in the consumer's thread by the ``tailguard_consume`` control command,
   tasks/worker.py). A message kombu fetched for a queue no longer consumed is put back
   on it by kombu; with late acks and a prefetch of one batch, every message the worker
   holds has a thread, so none strands in a local buffer (celery#2564);
2. **drain**: the old lanes' running jobs get ``TAILGUARD_MOVE_DRAIN_S`` to end; then each
   reclaimable one is **handed back**: aborted in the engine and queued again on its lane
   with its text so far, continuing where it stopped on whichever worker takes it (the
   borrower's reclaim path, tailguard/worker/runner.py). A streamed OpenAI job cannot be
   resumed elsewhere (vLLM's stream restarts), so it runs to its end here, beside the new
   lane's first jobs;
3. **start**: consume the new queues, with the prefetch set to the new lanes' batch
   (the engine and the thread pool were sized for the largest lane it may serve), and
   advertise the new lanes.

The move's duration, from the controller's decision to consuming the new lanes (on the
Redis clock), its drain and the jobs handed back are recorded with the move.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import redis

from tailguard.jobs.lane_orders import LaneOrders, Order, WorkerReport

log = logging.getLogger("tailguard.worker")

#: A report that did not change is written again after this long (Redis may have lost it).
REPORT_AGAIN_S = 5.0


@dataclass
class _Running:
    lane: str
    reclaimable: bool
    reclaim: threading.Event = field(default_factory=threading.Event)


class RunningJobs:
    """The worker's own jobs in flight, by lane, each with the event that hands it back."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[str, _Running] = {}
        self._changed = threading.Condition(self._lock)

    @contextlib.contextmanager
    def track(self, job_id: str, lane: str, reclaimable: bool) -> Iterator[threading.Event]:
        """Count `job_id` as running on `lane` while the block runs; the event it yields is
        set when the job must be handed back."""
        entry = _Running(lane, reclaimable)
        with self._lock:
            self._jobs[job_id] = entry
        try:
            yield entry.reclaim
        finally:
            with self._lock:
                self._jobs.pop(job_id, None)
                self._changed.notify_all()

    def by_lane(self) -> dict[str, int]:
        with self._lock:
            out: dict[str, int] = {}
            for job in self._jobs.values():
                out[job.lane] = out.get(job.lane, 0) + 1
            return out

    def _on(self, lanes: set[str]) -> list[_Running]:
        return [j for j in self._jobs.values() if j.lane in lanes]

    def hand_back(self, lanes: set[str], drain_s: float, settle_s: float = 30.0) -> tuple[float, int]:
        """Wait up to `drain_s` for the jobs on `lanes` to end, then hand back the
        reclaimable ones left and wait (up to `settle_s`) for them to be queued again; the
        others keep running. (seconds spent, jobs handed back)."""
        start = time.monotonic()
        with self._lock:
            self._changed.wait_for(lambda: not self._on(lanes), timeout=drain_s)
            told = [job_id for job_id, j in self._jobs.items() if j.lane in lanes and j.reclaimable]
            for job_id in told:
                self._jobs[job_id].reclaim.set()
            self._changed.wait_for(lambda: not any(job_id in self._jobs for job_id in told),
                                   timeout=settle_s)
        return time.monotonic() - start, len(told)


class LaneFollower:
    """Carries out this worker's lane orders (see the module docstring).

    `serving()` gives the lanes consumed now; `stop(lanes)` withdraws and stops consuming
    them; `start(lanes)` consumes and advertises them; `running` tracks the own jobs."""

    def __init__(self, worker: str, orders: LaneOrders,
                 assignments: list[tuple[str, ...]], serving: Callable[[], tuple[str, ...]],
                 stop: Callable[[tuple[str, ...]], None], start: Callable[[tuple[str, ...]], None],
                 running: RunningJobs, *, period_s: float, drain_s: float) -> None:
        self.worker, self.orders, self.assignments = worker, orders, [tuple(a) for a in assignments]
        self.serving, self._stop, self._start, self.running = serving, stop, start, running
        self.period_s, self.drain_s = period_s, drain_s
        self.version = 0
        self.moves = 0
        self._reported: tuple | None = None  # the last report written, and when
        self._reported_at = 0.0
        #: (order version, old lanes, drain s, handed back) of a move whose start failed
        self._stopped: tuple[int, tuple[str, ...], float, int] | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tailguard-lane-follower",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self.orders.forget(self.worker)
        except redis.RedisError:
            pass

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.step()
            except redis.RedisError as exc:
                log.warning("lane orders unreadable: %s", exc)
            except Exception:  # a failed move is retried next period
                log.exception("carrying out a lane order failed; retrying")
            self._stopping.wait(self.period_s)

    def step(self) -> Order | None:
        """Report, read the order, carry it out if it is new; the order carried out, if any."""
        order = self.orders.order_for(self.worker)
        moved = None
        # another version, not only a higher one: a Redis that lost its data numbers from 1 again
        if order is not None and order.version != self.version:
            if order.lanes == self.serving():
                self.version = order.version
            elif order.lanes not in self.assignments:
                log.error("lane order %d names %s, which this worker's entry does not allow "
                          "(%s): ignored", order.version, ",".join(order.lanes),
                          " | ".join(",".join(a) for a in self.assignments))
                self.version = order.version
            else:
                self.move(order)
                moved = order
        state = (self.serving(), self.version, self.running.by_lane())
        now = time.monotonic()
        if state != self._reported or now - self._reported_at >= REPORT_AGAIN_S:
            # written when it changes, and now and then for a Redis that lost it
            self.orders.report(WorkerReport(self.worker, tuple(self.assignments), *state,
                                            at=time.time()))
            self._reported, self._reported_at = state, now
        return moved

    def move(self, order: Order) -> None:
        stopped = self._stopped if self._stopped and self._stopped[0] == order.version else None
        if stopped is None:
            old = self.serving()
            log.info("lane order %d (%s): %s -> %s", order.version, order.reason or "-",
                     ",".join(old), ",".join(order.lanes))
            self._stop(old)
            drain_s, handed_back = self.running.hand_back(
                set(old) - set(order.lanes),
                self.drain_s if order.drain_s is None else order.drain_s)
            self._stopped = (order.version, old, drain_s, handed_back)
        else:  # its start failed (Redis away): the old lanes are stopped and drained already
            _, old, drain_s, handed_back = stopped
            log.info("lane order %d: starting %s again", order.version, ",".join(order.lanes))
        self._start(order.lanes)
        self._stopped = None
        self.version = order.version
        self.moves += 1
        seconds = max(0.0, self.orders.now() - order.at)
        log.info("now serving %s: %.2f s after the decision (drain %.2f s, %d job(s) handed "
                 "back)", ",".join(order.lanes), seconds, drain_s, handed_back)
        self.orders.moved(self.worker, order, from_=old, seconds=seconds, drain_s=drain_s,
                          handed_back=handed_back)
