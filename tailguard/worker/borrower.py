"""The worker side of work-conserving lanes: take another lane's job while our own are idle.

A worker whose ``[[workers]]`` entry has ``borrow = [...]`` runs one Borrower thread
beside its Celery consumer. Every ``period_s`` it reads its engine's load (slots from
its config, requests in flight from the engine host's counters, messages waiting on
its own lanes' queues) and asks tailguard/lanes/borrowing.py whether it may borrow. If so it
takes ONE message from a borrowed lane's queue with kombu (``basic_get``, acked late,
so a worker that dies with it leaves it to Redis's visibility timeout as a Celery
message would be) and runs it through the same JobRunner as the Celery task, on its
own thread, at vLLM priority ``BORROWED_PRIORITY``: in the engine's waiting queue the
worker's own requests (priority 0) come first.

When its own lanes need the slots back (free slots below ``borrow_headroom`` with own
work arriving), it **reclaims**: the youngest reclaimable borrowed jobs are aborted in the
engine and go back to ``queued`` with the text so far (tailguard/worker/runner.py), and a
fresh message for each is published to its lane's queue (a fresh one, not the old one put
back: the old one's Celery ``expires`` may have passed by now). The client's stream
pauses, then continues where it stopped, from whichever worker takes the job next. A
streamed OpenAI job is not reclaimable (vLLM's stream cannot continue elsewhere): it
keeps its slot to its end; a non-streamed one goes back to run again from scratch.

Why not Celery's ``add_consumer``: a Celery consumer prefetches up to the worker's
concurrency and a prefetched message cannot be taken back (celery#2564), which is
exactly the short tail we keep. One message at a time, only when the policy says so,
keeps the borrowed work bounded by ``borrow_max``.

A borrowed job keeps its lane's caps and deadline (they travel in the message and the
job record: the API capped max_tokens at admission), its queue TTL (the runner expires
it first) and its job record's lane; the job's ``worker`` field names the borrower.
Celery's per-lane ``rate_limit`` does not apply to it: that is a per-worker token
bucket inside the lane's own consumers, which a borrowed message never passes through.
Flower and Celery events do not show borrowed jobs (they are not Celery tasks here);
``celery inspect engine_stats`` and ``/metrics`` count them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from tailguard.lanes.borrowing import (
    BorrowPolicy,
    BorrowStats,
    EngineLoad,
    may_borrow,
    reclaim_count,
    youngest,
)
from tailguard.worker.runner import GenerationJob, JobReclaimed, JobRunner, JobSkipped, NoEngine

log = logging.getLogger("tailguard.borrower")

#: vLLM priority of a borrowed request (lower is scheduled first; own requests are 0).
BORROWED_PRIORITY = 1
#: How often the borrower looks for work while it may borrow.
PERIOD_S = 0.05
#: How long it backs off after the broker failed it.
RETRY_S = 1.0

_TASK_PREFIX = "tailguard.generate."


class Prioritized:
    """An engine whose every request runs at `priority`: what the borrower hands its runner."""

    def __init__(self, host: Any, priority: int) -> None:
        self.host, self.priority = host, priority

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        return self.host.generate(*args, priority=self.priority, **kwargs)

    def openai(self, *args: Any, **kwargs: Any) -> Any:
        return self.host.openai(*args, priority=self.priority, **kwargs)


class Borrower:
    """Takes jobs from the lanes `policy` names while `own_queues` are idle (see the module
    docstring). `connect` opens a kombu connection to the broker; `publish(lane, job)` queues
    a reclaimed job's message again; `in_flight` counts the requests in the engine now;
    `serving` says whether the engine may take work."""

    def __init__(self, policy: BorrowPolicy, own_queues: list[str], slots: int,
                 runner: JobRunner, connect: Callable[[], Any],
                 publish: Callable[[str, GenerationJob], None], in_flight: Callable[[], int],
                 serving: Callable[[], bool], period_s: float = PERIOD_S) -> None:
        self.policy, self.own_queues, self.slots = policy, own_queues, slots
        self.runner, self.connect, self.publish = runner, connect, publish
        self.in_flight, self.serving = in_flight, serving
        self.period_s = period_s
        self._lock = threading.Lock()  # the kombu channel, the stats and the jobs below
        self._stats = BorrowStats()
        #: borrowed jobs on the engine: id -> (when taken, set to reclaim it, reclaimable)
        self._jobs: dict[str, tuple[float, threading.Event, bool]] = {}
        self._conn: Any = None
        self._stopping = threading.Event()

    def start(self) -> None:
        """Borrow on a thread of its own until `stop`."""
        log.info("borrowing from %s while %s is idle (%s)", ", ".join(self.policy.lanes),
                 ", ".join(self.own_queues), self.policy)
        threading.Thread(target=self.run, args=(self._stopping,), name="tailguard-borrower",
                         daemon=True).start()

    def stop(self, give_back_s: float = 10.0) -> None:
        """Borrow no more, and give back what is borrowed (`give_back`)."""
        self._stopping.set()
        if not self.give_back(timeout_s=give_back_s):
            log.warning("borrowed jobs still running at shutdown: they end with the engine")

    def stats(self) -> BorrowStats:
        with self._lock:
            return dataclasses.replace(self._stats, borrowed=Counter(self._stats.borrowed))

    def run(self, stopping: threading.Event) -> None:
        """The borrower thread: one decision every period until `stopping`."""
        while not stopping.is_set():
            wait = self.period_s
            try:
                self.step()
            except Exception as exc:  # noqa: BLE001 - Redis down, a restart: try again later
                log.warning("borrowing failed: %s", exc)
                self._close()
                wait = RETRY_S
            stopping.wait(wait)
        self._close()

    def load(self) -> EngineLoad:
        """The engine's slots as the policy needs them."""
        with self._lock:
            borrowed = self._stats.running
            own_queued = sum(self._channel().queue_declare(queue=q).message_count
                             for q in self.own_queues)
        return EngineLoad(slots=self.slots, own_running=max(0, self.in_flight() - borrowed),
                          borrowed_running=borrowed, own_queued=own_queued)

    def step(self) -> str | None:
        """Reclaim what the policy says to give back, else take and start one borrowed job
        if it allows that now; the id of the job taken, else None."""
        if not self.serving():
            return None
        load = self.load()
        if self.reclaim(load):
            return None
        if not may_borrow(self.policy, load):
            return None
        with self._lock:
            channel = self._channel()
            for lane in self.policy.lanes:
                message = channel.basic_get(queue=lane, no_ack=False)
                if message is not None:
                    break
            else:
                return None
            job = self._job_of(message, lane)
            if job is None:
                message.ack()
                return None
            reclaim = threading.Event()
            self._jobs[job.job_id] = (time.monotonic(), reclaim, job.reclaimable)
            self._stats.borrowed[lane] += 1
            self._stats.running += 1
        threading.Thread(target=self._run, args=(lane, job, message, reclaim), daemon=True,
                         name=f"tailguard-borrowed-{job.job_id[:8]}").start()
        return job.job_id

    def reclaim(self, load: EngineLoad) -> list[str]:
        """Tell the youngest reclaimable borrowed jobs to give their slots back, as many as
        the policy says with `load`'s own queued work arriving; the ids told."""
        n = reclaim_count(self.policy, load, arriving=load.own_queued)
        if n == 0:
            return []
        with self._lock:
            live = [(job, at) for job, (at, ev, ok) in self._jobs.items()
                    if ok and not ev.is_set()]
            told = sum(ev.is_set() for _, ev, _ in self._jobs.values())  # still giving back
            chosen = youngest(live, n - told)
            for job in chosen:
                self._jobs[job][1].set()
        if chosen:
            log.info("reclaiming %s for %s", ", ".join(chosen), ", ".join(self.own_queues))
        return chosen

    def give_back(self, timeout_s: float) -> bool:
        """Reclaim every reclaimable borrowed job (the worker is stopping: they continue
        elsewhere rather than fail with its engine) and wait up to `timeout_s` for them to be
        queued again, and for the others to end; True if none is left."""
        with self._lock:
            for _, reclaim, reclaimable in self._jobs.values():
                if reclaimable:
                    reclaim.set()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if not self._jobs:
                    return True
            time.sleep(0.05)
        return False

    def _run(self, lane: str, job: GenerationJob, message: Any, reclaim: threading.Event) -> None:
        requeue = False
        try:
            self.runner.run(job, reclaimed=reclaim.is_set)
        except JobReclaimed as exc:
            with self._lock:
                self._stats.reclaimed += 1
                self._stats.wasted_tokens += exc.wasted_tokens
            try:
                self.publish(lane, job)
            except Exception:  # the record is queued: it expires, never hangs
                log.exception("reclaimed job %s could not be queued again", job.job_id)
        except JobSkipped:
            pass
        except NoEngine:
            requeue = True  # still queued: another worker (or we, later) can run it
        except Exception:  # the runner recorded how the job ended
            log.info("borrowed job %s ended in error", job.job_id, exc_info=True)
        finally:
            self._settle(job.job_id, message, requeue=requeue)

    def _settle(self, job_id: str, message: Any, *, requeue: bool) -> None:
        """The borrowed job is over here: ack its message, or put it back on its queue."""
        with self._lock:
            self._jobs.pop(job_id, None)
            self._stats.running -= 1
            if requeue:
                message.reject(requeue=True)
            else:
                message.ack()

    @staticmethod
    def _job_of(message: Any, lane: str) -> GenerationJob | None:
        """The job a generation task message carries; None (logged) for anything else."""
        task = (message.headers or {}).get("task", "")
        try:
            if task != _TASK_PREFIX + lane or message.content_type != "application/json":
                raise ValueError(f"not a generation task of lane {lane}: {task!r}")
            _, kwargs, _ = json.loads(message.body)
            return GenerationJob(**kwargs)
        except (TypeError, ValueError) as exc:
            log.error("dropping a message borrowed from %s: %s", lane, exc)
            return None

    def _channel(self) -> Any:
        if self._conn is None:
            self._conn = self.connect()
        return self._conn.default_channel

    def _close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.release()
            except Exception:  # noqa: BLE001 - it is being dropped
                pass
