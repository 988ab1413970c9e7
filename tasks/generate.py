"""The generation task: one per lane (`tailguard.generate.<lane>`), all the same body.

A task name per lane makes Celery's per-task `rate_limit` (and Flower's task
view) per lane. The body adapts Celery to tailguard/runner.py, which owns the
job's lifecycle: a job that ended elsewhere (cancelled, expired, a redelivered
duplicate) ends the task with `Ignore`, so Celery never overwrites what the job
record says, and a dead engine stops the worker.
"""

from __future__ import annotations

from typing import Any

from celery import Task
from celery.exceptions import Ignore

from tailguard.errors import EngineDeadError
from tailguard.lanes import load_lanes
from tailguard.runner import GenerationJob, JobSkipped
from tasks.celery import app
from tasks.worker import WorkerRuntime


def _register(lane_name: str) -> None:
    @app.task(name=f"tailguard.generate.{lane_name}", bind=True, acks_late=True)
    def generate(self: Task, job_id: str, prompt: str, max_tokens: int,
                 sampling: dict[str, Any], deadline_s: float,
                 add_special_tokens: bool = True) -> dict[str, Any]:
        runtime = WorkerRuntime.of(self.app)
        try:
            return runtime.runner.run(GenerationJob(job_id, prompt, max_tokens, sampling,
                                                    deadline_s, add_special_tokens))
        except JobSkipped:
            raise Ignore()
        except EngineDeadError:
            runtime.stop_worker()
            raise


for _lane in load_lanes():
    _register(_lane.name)
