"""The gateway's domain logic: accept a request, place it on its lane, report on it.

Framework-free: the Flask views in app/ are a thin skin over this, and tests can
drive it directly. Dependencies (lane table, job store, token counter, the
broker: app/ passes a producer-only Celery app) are passed in; nothing here imports
Celery.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from tailguard.errors import (
    JobCancelled,
    JobNotFound,
    JobStateConflict,
    NoLiveWorker,
    Refused,
    WaitTooLong,
)
from tailguard.gateway.api_keys import ApiKey, ApiKeyStore
from tailguard.gateway.job_request import JobRequest
from tailguard.jobs.finished import FinishedConsumer
from tailguard.jobs.lane_load import LaneLoadStore
from tailguard.jobs.store import (
    CANCELLED,
    QUEUED,
    RUNNING,
    TERMINAL,
    BacklogMoved,
    JobStore,
    timing,
)
from tailguard.jobs.stream import StreamEvent, follow
from tailguard.lanes.admission import AdmissionPolicy
from tailguard.lanes.placement import Placement, place
from tailguard.lanes.table import LaneTable
from tailguard.observe.metrics import GatewayMetrics
from tailguard.observe.stats import StatsStore
from tailguard.redis.keys import is_job_id


class TokenCounter(Protocol):
    model_max_len: int | None

    def count(self, prompt: str, add_special_tokens: bool = True) -> int: ...


class Broker(Protocol):
    """What the gateway needs of Celery (tailguard.jobs.task_message.TaskMessages): a task's
    message for a lane's queue, which the job store pushes with the job's record; revoking
    a task."""

    control: Any  # celery.app.control.Control: .revoke(task_id)

    def build(self, name: str, *, task_id: str, queue: str, kwargs: dict[str, Any],
              expires_s: float) -> str: ...


class Gateway:
    def __init__(self, lanes: LaneTable, store: JobStore, counter: TokenCounter, broker: Broker,
                 *, metrics: GatewayMetrics | None = None, poll_interval_s: float = 0.05,
                 admission: AdmissionPolicy | None = None, load: LaneLoadStore | None = None,
                 stats: StatsStore | None = None, api_keys: ApiKeyStore | None = None) -> None:
        self.lanes = lanes
        self.store = store
        self.counter = counter
        self.broker = broker
        self.metrics = metrics or GatewayMetrics(lanes.names)
        self.admission = admission or AdmissionPolicy()
        self.load = load or LaneLoadStore(store.redis)
        self.stats = stats or StatsStore(store.redis)
        self.api_keys = api_keys or ApiKeyStore(store.redis)
        self.finished: FinishedConsumer | None = None  # set by the app that runs one
        self.poll_interval_s = poll_interval_s
        #: Set by close(): stops the background threads the app started (the reaper).
        self.stopping = threading.Event()
        #: the app's Celery producer (revokes, redelivery) and whether start_background ran
        self.producer: Any = None
        self.background_started = False

    def close(self) -> None:
        """Stop the background threads (finished-stream consumer, reaper): what a process that
        builds more than one app, a test run, calls when it is done with one."""
        self.stopping.set()
        if self.finished is not None:
            self.finished.stop()

    def place(self, req: JobRequest) -> Placement:
        return place(self.lanes.lanes, priority=req.priority,
                     prompt_tokens=self.counter.count(req.prompt, req.add_special_tokens),
                     requested_max_tokens=req.max_tokens, model_max_len=self.counter.model_max_len)

    def submit(self, req: JobRequest, caller: ApiKey | None = None) -> dict[str, Any]:
        """Admit the request on its lane, charge it to the caller's key, then record the job
        and queue its task message in one Redis call.

        Returns the 202 body; raises Refused (429) or NoLiveWorker (503), counted per lane
        and per key. A key's priority ceiling lowers the request's class before placement.
        """
        if caller is not None:
            req = dataclasses.replace(req, priority=caller.priority_for(req.priority))
        placement = self.place(req)
        lane = self.lanes[placement.lane]
        load = self.load.load(lane.name)
        try:
            wait_s = self.admission.admit(lane, load, placement.cost)
        except (Refused, NoLiveWorker) as exc:
            self._count_refusal(lane.name, exc, caller, load.now)
            raise
        if caller is not None:
            try:
                self.api_keys.take(caller, placement.cost)
            except Refused as exc:
                self.metrics.on_refused(lane.name, exc.code, caller.name)
                raise
        job_id = uuid.uuid4().hex
        fields = {
            "lane": lane.name, "priority": req.priority, "prompt_tokens": placement.prompt_tokens,
            "requested_max_tokens": placement.requested_max_tokens,
            "max_tokens": placement.max_tokens, "max_tokens_capped": placement.max_tokens_capped,
            "cost": placement.cost, "deadline_s": lane.deadline_s, "sampling": req.sampling,
            "api_key": caller.name if caller else None,
        }
        message = self.broker.build(
            lane.task_name, task_id=job_id, queue=lane.queue, expires_s=lane.queue_ttl_s,
            kwargs={"job_id": job_id, "prompt": req.prompt, "max_tokens": placement.max_tokens,
                    "sampling": req.sampling, "deadline_s": lane.deadline_s,
                    **({} if req.add_special_tokens else {"add_special_tokens": False})})
        try:
            # The record and the lane's message in one step: a worker never runs an unknown
            # job, and no record waits for a message that was never sent.
            self.store.create(job_id, fields, queue_ttl_s=lane.queue_ttl_s,
                              limits=self.admission.limits(lane, load),
                              message=(lane.queue, message))
        except BacklogMoved as moved:
            # Other requests took the room this one was admitted into: decide again on the
            # lane as it is now (it raises, with the Retry-After that load gives).
            load = moved.moved(load)
            try:
                self.admission.admit(lane, load, placement.cost)
                raise WaitTooLong(f"lane {lane.name!r} filled up meanwhile", retry_after_s=1,
                                  lane=lane.name) from None
            except (Refused, NoLiveWorker) as exc:
                self._count_refusal(lane.name, exc, caller, load.now)
                raise
        self.metrics.on_accepted(lane.name, placement.max_tokens_capped,
                                 caller.name if caller else None)
        return {"id": job_id, "status": QUEUED, "lane": lane.name, "priority": req.priority,
                "prompt_tokens": placement.prompt_tokens,
                "requested_max_tokens": placement.requested_max_tokens,
                "max_tokens": placement.max_tokens,
                "max_tokens_capped": placement.max_tokens_capped, "cost": placement.cost,
                "estimated_start_s": round(wait_s, 3)}

    def _count_refusal(self, lane: str, exc: Refused | NoLiveWorker, caller: ApiKey | None,
                       at: float | None) -> None:
        """A lane's refusal (`at`: the Redis clock of the load it was decided on), in /metrics
        and in `tailguard stats`."""
        self.metrics.on_refused(lane, exc.code, caller.name if caller else None)
        self.stats.record_refused(lane, exc.code, at)

    def status(self, job_id: str, wait_s: float = 0.0) -> dict[str, Any]:
        """The job as the client sees it; with wait_s, long-poll until it is terminal."""
        return render(job_id, self.wait(job_id, wait_s))

    def wait(self, job_id: str, wait_s: float,
             still_wanted: Callable[[], bool] | None = None) -> dict[str, Any]:
        """The job record once terminal, or as it is after wait_s.

        `still_wanted` is asked between polls; when it says no (the client hung up),
        the job is cancelled so it stops holding a place in its lane's engine.
        """
        if not is_job_id(job_id):
            raise JobNotFound(f"no job {job_id!r}")
        deadline = time.monotonic() + wait_s
        while True:
            job = self.store.settle(job_id)
            if job is None:
                raise JobNotFound(f"no job {job_id!r} (unknown, or its record expired)")
            if job["status"] in TERMINAL or time.monotonic() >= deadline:
                return job
            if still_wanted is not None and not still_wanted():
                self.cancel(job_id, reason="the client disconnected", missing_ok=True)
                return self.store.get(job_id) or job
            time.sleep(min(self.poll_interval_s, max(0.0, deadline - time.monotonic())))

    def cancel(self, job_id: str, *, reason: str = "cancelled by the client",
               missing_ok: bool = False) -> dict[str, Any]:
        """Cancel a queued or running job. The worker aborts it in the engine within ~50 ms."""
        if not is_job_id(job_id):
            raise JobNotFound(f"no job {job_id!r}")
        moved, before = self.store.transition(job_id, {QUEUED, RUNNING}, CANCELLED,
                                              {"error": JobCancelled(reason).to_dict()})
        if not moved and not missing_ok:
            if before is None:
                raise JobNotFound(f"no job {job_id!r} (unknown, or its record expired)")
            raise JobStateConflict(f"job {job_id} already ended ({before}): nothing to cancel")
        if moved and before == QUEUED:
            # Let a worker that already reserved the message drop it without running it
            # (the job record says cancelled either way); Flower shows it as revoked.
            self.broker.control.revoke(job_id)
        job = self.store.get(job_id)
        return render(job_id, job) if job else {"id": job_id, "status": CANCELLED}

    def events(self, job_id: str, after: str = "0-0", *, heartbeat_s: float = 2.0,
               just_submitted: bool = False) -> Iterator[StreamEvent | None]:
        """The job's output events from `after` on, ending with its end event.

        Yields None on each `heartbeat_s` of silence (so the caller can write a
        heartbeat and notice a gone client); overdue jobs are settled meanwhile. May end
        with an "error" event instead (see `follow`): the job goes on. `just_submitted`:
        this process created the job a moment ago (a streamed submit), so it exists and
        is not overdue; the read that would check that is one less on its way to the
        first token.
        """
        if not is_job_id(job_id):
            raise JobNotFound(f"no job {job_id!r}")
        if not just_submitted and self.store.settle(job_id) is None:
            raise JobNotFound(f"no job {job_id!r} (unknown, or its record expired)")
        def status() -> str | None:
            job = self.store.settle(job_id)
            return None if job is None else job["status"]

        return follow(self.store.redis, job_id, after, heartbeat_s=heartbeat_s, status=status)


def render(job_id: str, job: dict[str, Any]) -> dict[str, Any]:
    """The public view of a job record."""
    return {
        "id": job_id,
        "status": job["status"],
        "lane": job.get("lane"),
        "priority": job.get("priority"),
        "prompt_tokens": job.get("prompt_tokens"),
        "requested_max_tokens": job.get("requested_max_tokens"),
        "max_tokens": job.get("max_tokens"),
        "max_tokens_capped": job.get("max_tokens_capped", False),
        "result": job.get("result"),
        "error": job.get("error"),
        "worker": job.get("worker"),
        "timing": timing(job),
    }
