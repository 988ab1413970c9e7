"""The generation task: one per lane (`tailguard.generate.<lane>`), all the same body.

A task name per lane makes Celery's per-task `rate_limit` (and Flower's task
view) per lane. The body is thin: check the job is still wanted, run it on the
worker's engine, record the terminal state. Every path ends the job in a state
the client can read; a transition that loses a race (cancelled, expired, a
redelivered duplicate) ends the task with `Ignore`, so Celery never overwrites
what the job record says.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Task
from celery.exceptions import Ignore

from tailguard.errors import EngineDeadError, EngineError
from tailguard.jobs import EXPIRED, FAILED, QUEUED, RUNNING, SUCCEEDED
from tailguard.lanes import load_lanes
from tasks import worker
from tasks.celery import app

log = logging.getLogger("tailguard.task")


def run_generation(task: Task, job_id: str, prompt: str, max_tokens: int,
                   sampling: dict[str, Any], deadline_s: float) -> dict[str, Any]:
    ctx = worker.current()
    store = ctx.store
    # A prefetched message can sit in the thread pool past its `expires`: look again.
    moved, _ = store.transition(
        job_id, {QUEUED}, EXPIRED,
        {"error": {"code": "expired",
                   "message": "the request waited in its lane's queue past queue_ttl_s"}},
        overdue_field="expires_at")
    if moved:
        raise Ignore()
    moved, state = store.transition(job_id, {QUEUED}, RUNNING, {"worker": ctx.hostname})
    if not moved:
        log.info("job %s is %s, not queued: skipping", job_id, state)
        raise Ignore()

    try:
        result = ctx.ready_engine().generate(job_id, prompt, {**sampling, "max_tokens": max_tokens},
                                     deadline_s=deadline_s)
    except EngineError as exc:
        store.transition(job_id, {RUNNING}, FAILED, {"error": exc.to_dict()})
        if isinstance(exc, EngineDeadError):
            log.critical("engine is dead; stopping this worker so it can be restarted")
            task.app.control.shutdown(destination=[ctx.hostname])
        raise
    except Exception as exc:
        # A bug must not leave the job "running" until worker_lost settles it.
        store.transition(job_id, {RUNNING}, FAILED,
                         {"error": {"code": "internal_error", "message": f"{type(exc).__name__}: {exc}"}})
        raise
    body = {"text": result.text, "completion_tokens": result.completion_tokens,
            "finish_reason": result.finish_reason}
    store.transition(job_id, {RUNNING}, SUCCEEDED, {
        "result": body, "completion_tokens": result.completion_tokens,
        "ttft_s": None if result.ttft_s is None else f"{result.ttft_s:.6f}",
        "engine_prompt_tokens": result.prompt_tokens})
    return body


def _register(lane_name: str) -> None:
    @app.task(name=f"tailguard.generate.{lane_name}", bind=True, acks_late=True)
    def generate(self: Task, job_id: str, prompt: str, max_tokens: int,
                 sampling: dict[str, Any], deadline_s: float) -> dict[str, Any]:
        return run_generation(self, job_id, prompt, max_tokens, sampling, deadline_s)


for _lane in load_lanes():
    _register(_lane.name)
