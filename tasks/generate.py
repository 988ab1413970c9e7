"""The generation task: one per lane (`tailguard.generate.<lane>`), all the same body.

A task name per lane makes Celery's per-task `rate_limit` (and Flower's task
view) per lane. An OpenAI request's job also carries `openai` (its endpoint and the
client's body, run through vLLM's own serving layer). The body adapts Celery to
tailguard/worker/runner.py, which owns the job's lifecycle: a job that ended elsewhere
(cancelled, expired, a redelivered duplicate) ends the task with `Ignore`, so Celery
never overwrites what the job record says; a job whose worker gave up on its engine
before the job started goes back to its lane's queue (`Reject(requeue=True)`) for
another worker, and so does a message that reached this worker past its lane's per-engine
limit or its engine's prefill bound (tailguard/worker/lane_gate.py) without running.
"""

from __future__ import annotations

from typing import Any

from celery import Task
from celery.exceptions import Ignore, Reject

from tailguard.lanes.table import load_lanes
from tailguard.worker.runner import GenerationJob, JobSkipped, NoEngine
from tailguard.worker.runtime import WorkerRuntime
from tasks.celery import app


def _register(lane_name: str) -> None:
    @app.task(name=f"tailguard.generate.{lane_name}", bind=True, acks_late=True)
    def generate(self: Task, job_id: str, prompt: str, max_tokens: int,
                 sampling: dict[str, Any], deadline_s: float,
                 add_special_tokens: bool = True,
                 openai: dict[str, Any] | None = None,
                 prefill_tokens: int = 0) -> dict[str, Any]:  # the lane gate's, at receipt
        runtime = WorkerRuntime.of(self.app)
        job = GenerationJob(job_id, prompt, max_tokens, sampling, deadline_s, add_special_tokens,
                            openai)
        gate = runtime.gate
        try:
            if gate is not None and gate.over(self.request.id):
                raise Reject(requeue=True)
            body = runtime.runner_for(lane_name).run(job)
        except JobSkipped:
            raise Ignore() from None
        except NoEngine:
            raise Reject(requeue=True) from None
        finally:
            if gate is not None:
                gate.ended(self.request.id)
        # Celery logs a task's return value at INFO: the text stays in the job record.
        return {k: v for k, v in body.items() if k != "text"}


for _lane in load_lanes():
    _register(_lane.name)
