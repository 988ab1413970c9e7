"""The gateway's domain logic: accept a request, place it on its lane, report on it.

Framework-free: the Flask views in app/ are a thin skin over this, and tests can
drive it directly. Dependencies (lane table, job store, token counter, Celery
app) are passed in.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Protocol

from celery import Celery

from tailguard.errors import JobNotFound
from tailguard.jobrequest import JobRequest
from tailguard.jobs import FAILED, QUEUED, TERMINAL, JobStore, timing
from tailguard.keys import is_job_id
from tailguard.lanes import LaneTable
from tailguard.placement import Placement, place


class TokenCounter(Protocol):
    model_max_len: int | None

    def count(self, prompt: str) -> int: ...


class Gateway:
    def __init__(self, lanes: LaneTable, store: JobStore, counter: TokenCounter, celery: Celery,
                 *, poll_interval_s: float = 0.05) -> None:
        self.lanes = lanes
        self.store = store
        self.counter = counter
        self.celery = celery
        self.poll_interval_s = poll_interval_s

    def place(self, req: JobRequest) -> Placement:
        return place(self.lanes.lanes, priority=req.priority,
                     prompt_tokens=self.counter.count(req.prompt),
                     requested_max_tokens=req.max_tokens, model_max_len=self.counter.model_max_len)

    def submit(self, req: JobRequest) -> dict[str, Any]:
        """Record the job, then publish it to its lane's queue. Returns the 202 body."""
        placement = self.place(req)
        lane = self.lanes[placement.lane]
        job_id = uuid.uuid4().hex
        # The record exists before the message, so a worker never runs an unknown job.
        self.store.create(job_id, {
            "lane": lane.name, "priority": req.priority, "prompt_tokens": placement.prompt_tokens,
            "requested_max_tokens": placement.requested_max_tokens,
            "max_tokens": placement.max_tokens, "max_tokens_capped": placement.max_tokens_capped,
            "cost": placement.cost, "deadline_s": lane.deadline_s, "sampling": req.sampling,
        }, queue_ttl_s=lane.queue_ttl_s)
        try:
            self.celery.send_task(
                lane.task_name, task_id=job_id, queue=lane.queue, expires=lane.queue_ttl_s,
                kwargs={"job_id": job_id, "prompt": req.prompt, "max_tokens": placement.max_tokens,
                        "sampling": req.sampling, "deadline_s": lane.deadline_s})
        except Exception as exc:
            self.store.transition(job_id, {QUEUED}, FAILED, {
                "error": {"code": "enqueue_failed", "message": f"could not queue the request: {exc}"}})
            raise
        return {"id": job_id, "status": QUEUED, "lane": lane.name, "priority": req.priority,
                "prompt_tokens": placement.prompt_tokens,
                "requested_max_tokens": placement.requested_max_tokens,
                "max_tokens": placement.max_tokens,
                "max_tokens_capped": placement.max_tokens_capped, "cost": placement.cost}

    def status(self, job_id: str, wait_s: float = 0.0) -> dict[str, Any]:
        """The job as the client sees it; with wait_s, long-poll until it is terminal."""
        if not is_job_id(job_id):
            raise JobNotFound(f"no job {job_id!r}")
        deadline = time.monotonic() + wait_s
        while True:
            job = self.store.settle(job_id)
            if job is None:
                raise JobNotFound(f"no job {job_id!r} (unknown, or its record expired)")
            if job["status"] in TERMINAL or time.monotonic() >= deadline:
                return render(job_id, job)
            time.sleep(min(self.poll_interval_s, max(0.0, deadline - time.monotonic())))

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Healthy when Redis answers and every lane has a live worker with its engine up."""
        live = self.store.live_workers(self.lanes.names)
        missing = [lane for lane, n in live.items() if n == 0]
        return not missing, {"status": "ok" if not missing else "degraded", "redis": "ok",
                             "workers_per_lane": live, "lanes_without_worker": missing}


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
