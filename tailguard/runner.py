"""The lifecycle of one generation job on a worker, free of Celery.

    queued ──(still wanted?)──► running ──► succeeded | failed | cancelled

A job may have ended before its worker reaches it (a prefetched message can
wait in the thread pool past its queue TTL; the client may cancel; a
redelivered duplicate finds it already running or done). Every such race ends
in ``JobSkipped``: the job record already says how the job ended, and the
caller must record nothing over it (the Celery task raises ``Ignore``).
Otherwise the job runs on the worker's engine, its text goes to the job's
stream as it comes, a cancel is noticed while it runs, and the job ends in a
terminal state the client can read on every path.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from tailguard.engine import GenerationResult
from tailguard.errors import EngineError, InternalJobError, JobCancelled, JobExpired
from tailguard.jobs import CANCELLED, EXPIRED, FAILED, QUEUED, RUNNING, SUCCEEDED, JobStore
from tailguard.stream import DeltaWriter

log = logging.getLogger("tailguard.task")

QUEUE_TTL_PASSED = "the request waited in its lane's queue past queue_ttl_s"


class JobSkipped(Exception):
    """The job is no longer this run's to finish: its record already says how it ended."""


@dataclass(frozen=True)
class GenerationJob:
    """What a generation task message carries (ids and primitives only)."""

    job_id: str
    prompt: str
    max_tokens: int
    sampling: dict[str, Any]
    deadline_s: float
    add_special_tokens: bool = True


class Engine(Protocol):
    """What the runner needs of an engine: tailguard.engine.EngineHost.generate."""

    def generate(self, request_id: str, prompt: str, sampling: dict, deadline_s: float | None,
                 on_first_token: Callable[[], None] | None = None,
                 should_cancel: Callable[[], bool] | None = None,
                 on_delta: Callable[[str], None] | None = None,
                 add_special_tokens: bool = True) -> GenerationResult: ...


class JobRunner:
    """Runs generation jobs of one worker; shared by its task threads.

    ``engine`` is called once per job for the engine to run it on: the worker hands
    its engine out only once it has started and warmed up (and raises EngineDeadError
    if it cannot). ``writer_for`` builds the stream writer of a job.
    """

    def __init__(self, engine: Callable[[], Engine], store: JobStore,
                 writer_for: Callable[[str], DeltaWriter], worker: str) -> None:
        self.engine = engine
        self.store = store
        self.writer_for = writer_for
        self.worker = worker

    def expire(self, job_id: str, *, only_if_overdue: bool = True) -> bool:
        """End a still-queued job as expired; True if this call did.

        With only_if_overdue, only once the Redis clock is past its expires_at.
        """
        moved, _ = self.store.transition(
            job_id, {QUEUED}, EXPIRED, {"error": JobExpired(QUEUE_TTL_PASSED).to_dict()},
            overdue_field="expires_at" if only_if_overdue else "")
        return moved

    def run(self, job: GenerationJob) -> dict[str, Any]:
        """Run `job` to its end and return its result body.

        Raises JobSkipped when the job ended elsewhere (see the module docstring),
        EngineError (EngineDeadError: the worker cannot go on) after recording the job
        failed, and any other exception after recording it failed as internal_error.
        """
        store, job_id = self.store, job.job_id
        if self.expire(job_id):
            raise JobSkipped(f"job {job_id} expired in the queue")
        moved, state = store.transition(job_id, {QUEUED}, RUNNING, {"worker": self.worker})
        if not moved:
            log.info("job %s is %s, not queued: skipping", job_id, state)
            raise JobSkipped(f"job {job_id} is {state}")

        writer = self.writer_for(job_id)

        def should_cancel() -> bool:
            # Polled every ~50 ms on this thread while the engine works: a good moment to
            # write a batch of deltas that is due even if no new token arrived.
            writer.tick()
            return store.status(job_id) == CANCELLED

        try:
            result = self.engine().generate(
                job_id, job.prompt, {**job.sampling, "max_tokens": job.max_tokens},
                deadline_s=job.deadline_s, on_delta=writer.add, should_cancel=should_cancel,
                add_special_tokens=job.add_special_tokens)
            writer.flush()
        except EngineError as exc:
            store.transition(job_id, {RUNNING}, FAILED, {"error": exc.to_dict()})
            raise
        except Exception as exc:
            # A bug must not leave the job "running" until worker_lost settles it.
            store.transition(job_id, {RUNNING}, FAILED, {
                "error": InternalJobError(f"{type(exc).__name__}: {exc}").to_dict()})
            raise
        if result.finish_reason == "cancelled":
            # Aborted in the engine because the job was cancelled (DELETE, client gone):
            # the cancel already ended the job; this only covers an abort from elsewhere.
            store.transition(job_id, {RUNNING}, CANCELLED, {
                "error": JobCancelled("the request was aborted in the engine").to_dict()})
            raise JobSkipped(f"job {job_id} was aborted in the engine")
        body = {"text": result.text, "completion_tokens": result.completion_tokens,
                "finish_reason": result.finish_reason}
        moved, state = store.transition(job_id, {RUNNING}, SUCCEEDED, {
            "result": body, "completion_tokens": result.completion_tokens,
            "ttft_s": None if result.ttft_s is None else f"{result.ttft_s:.6f}",
            "engine_prompt_tokens": result.prompt_tokens})
        if not moved:
            # Cancelled (or settled) just as it finished: that state stands, and the
            # caller must not record a success that contradicts it.
            log.info("job %s finished but is already %s", job_id, state)
            raise JobSkipped(f"job {job_id} is already {state}")
        return body
