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
from tailguard import settings
from tailguard.jobs import CANCELLED, EXPIRED, FAILED, QUEUED, RUNNING, SUCCEEDED
from tailguard.lanes import load_lanes
from tailguard.stream import DeltaWriter
from tasks import worker
from tasks.celery import app

log = logging.getLogger("tailguard.task")


def run_generation(task: Task, job_id: str, prompt: str, max_tokens: int,
                   sampling: dict[str, Any], deadline_s: float,
                   add_special_tokens: bool = True) -> dict[str, Any]:
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

    writer = DeltaWriter(store.redis, job_id, flush_s=settings.STREAM_FLUSH_S.get(),
                         maxlen=store.stream_maxlen, ttl_s=store.ttl_s)

    def should_cancel() -> bool:
        # Polled every ~50 ms on this thread while the engine works: a good moment to
        # write a batch of deltas that is due even if no new token arrived.
        writer.tick()
        return store.status(job_id) == CANCELLED

    try:
        result = ctx.ready_engine().generate(job_id, prompt, {**sampling, "max_tokens": max_tokens},
                                             deadline_s=deadline_s, on_delta=writer.add,
                                             should_cancel=should_cancel,
                                             add_special_tokens=add_special_tokens)
        writer.flush()
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
    if result.finish_reason == "cancelled":
        # Aborted in the engine because the job was cancelled (DELETE, client gone):
        # the cancel already ended the job; this only covers an abort from elsewhere.
        store.transition(job_id, {RUNNING}, CANCELLED, {"error": {
            "code": "cancelled", "message": "the request was aborted in the engine"}})
        raise Ignore()
    body = {"text": result.text, "completion_tokens": result.completion_tokens,
            "finish_reason": result.finish_reason}
    moved, state = store.transition(job_id, {RUNNING}, SUCCEEDED, {
        "result": body, "completion_tokens": result.completion_tokens,
        "ttft_s": None if result.ttft_s is None else f"{result.ttft_s:.6f}",
        "engine_prompt_tokens": result.prompt_tokens})
    if not moved:
        # Cancelled (or settled) just as it finished: that state stands, and Celery
        # must not record a SUCCESS that contradicts it.
        log.info("job %s finished but is already %s", job_id, state)
        raise Ignore()
    return body


def _register(lane_name: str) -> None:
    @app.task(name=f"tailguard.generate.{lane_name}", bind=True, acks_late=True)
    def generate(self: Task, job_id: str, prompt: str, max_tokens: int,
                 sampling: dict[str, Any], deadline_s: float,
                 add_special_tokens: bool = True) -> dict[str, Any]:
        return run_generation(self, job_id, prompt, max_tokens, sampling, deadline_s,
                              add_special_tokens)


for _lane in load_lanes():
    _register(_lane.name)
