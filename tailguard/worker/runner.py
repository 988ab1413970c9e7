"""The lifecycle of one generation job on a worker, free of Celery.

    queued ──(still wanted? engine up?)──► running ──► succeeded | failed | cancelled
                                             │  ▲
                                             └──┘ engine died before its first token:
                                                  once, on the restarted engine

A job may have ended before its worker reaches it (a prefetched message can
wait in the thread pool past its queue TTL; the client may cancel; a
redelivered duplicate finds it already running or done). Every such race ends
in ``JobSkipped``: the job record already says how the job ended, and the
caller must record nothing over it (the Celery task raises ``Ignore``).
Otherwise the job runs on the worker's engine, its text goes to the job's
stream as it comes, a cancel (or any other end, e.g. the reaper's) is noticed
while it runs, and the job ends in a terminal state the client can read on every path.

A job is marked running only once the engine is up and warm: a task that arrives
while the engine starts or restarts waits for it with the job still queued.

When the engine dies under a job (EngineDeadError), the worker restarts it
(tailguard/engine/keeper.py) and the job's engine deaths are counted in its record
(``engine_deaths``). Delivery semantics:

* a job that had streamed no token yet is run once more, by the same task, on the
  restarted engine (it stays ``running`` meanwhile, so the reaper still covers it if
  the whole worker dies); the client sees nothing of the first try;
* a job that had streamed text fails with ``engine_dead``: its stream cannot be
  taken back, so running it again would show the client two beginnings;
* a job in flight during a second engine death fails with ``poison_request`` and is
  never run again, whatever it streamed: it is the likeliest cause.

An **OpenAI job** (its message's ``openai``: the endpoint, the client's body as the API
validated it, whether max_tokens was capped) runs through vLLM's own serving layer on
the engine (``Engine.openai``: tailguard/engine/serving.py), with the same lifecycle. Its
stream gets vLLM's chunks (a streamed request) or its response (a non-streamed one) instead
of deltas; the end event says the same as a native job's, with the engine's prompt tokens.
"Streamed" above means: its first chunk (the role) reached the stream.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from tailguard.engine.host import Engine, GenerationResult, OpenAIResult
from tailguard.errors import (
    EngineDeadError,
    EngineError,
    InternalJobError,
    JobCancelled,
    JobExpired,
    PoisonRequest,
)
from tailguard.jobs.prefix_index import PrefixIndex
from tailguard.jobs.store import CANCELLED, EXPIRED, FAILED, QUEUED, RUNNING, SUCCEEDED, JobStore
from tailguard.jobs.stream import OUTAGE_S, DeltaWriter

log = logging.getLogger("tailguard.task")

QUEUE_TTL_PASSED = "the request waited in its lane's queue past queue_ttl_s"
#: A job in flight during this many engine deaths is quarantined (poison_request).
POISON_DEATHS = 2
INTERNAL_ERROR_MESSAGE = "internal error while running the request; it has been logged"
#: How often a running job's record is read to see whether it is still wanted (a cancel, the
#: reaper): a Redis round trip per running job, on the core the front end shares.
STATUS_POLL_S = 0.2


class JobSkipped(Exception):
    """The job is no longer this run's to finish: its record already says how it ended."""


class NoEngine(Exception):
    """The worker gave up on its engine before the job started: the job is still queued,
    and its message belongs back in the lane's queue for another worker."""


@dataclass(frozen=True)
class GenerationJob:
    """What a generation task message carries (ids and primitives only)."""

    job_id: str
    prompt: str
    max_tokens: int
    sampling: dict[str, Any]
    deadline_s: float
    add_special_tokens: bool = True
    #: an OpenAI job's {"endpoint", "request", "prompt_tokens", "capped"} (prompt and sampling
    #: are empty then): the API's task message contract
    openai: dict[str, Any] | None = None


class Prioritized:
    """An engine whose every request runs at vLLM `priority` (lower is scheduled first)."""

    def __init__(self, host: Any, priority: int) -> None:
        self.host, self.priority = host, priority

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        return self.host.generate(*args, priority=self.priority, **kwargs)

    def openai(self, *args: Any, **kwargs: Any) -> Any:
        return self.host.openai(*args, priority=self.priority, **kwargs)


class JobRunner:
    """Runs generation jobs of one worker; shared by its task threads.

    ``engine`` is called for the engine to run a job on: the worker hands its engine
    out only once it is up and warm, waits while it restarts, and raises
    EngineDeadError if it has given up. ``engine_died`` is told which engine died
    under a job (the worker withdraws its lanes and restarts it). ``writer_for``
    builds the stream writer of a job.
    """

    def __init__(self, engine: Callable[[], Engine], store: JobStore,
                 writer_for: Callable[[str], DeltaWriter], worker: str,
                 engine_died: Callable[[Engine], None] = lambda engine: None,
                 offers: PrefixIndex | None = None,
                 prefilled: Callable[[str], None] = lambda job_id: None) -> None:
        self.engine = engine
        #: told each job's id once its first token is out (its prefill is done)
        self.prefilled = prefilled
        #: prefix affinity's index and offers (None: off)
        self.offers = offers
        self.store = store
        self.writer_for = writer_for
        self.worker = worker
        self.engine_died = engine_died

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
        NoEngine when the worker gave up on its engine before the job started (the job
        is still queued), EngineError after recording the job failed, and any other
        exception after recording it failed as internal_error.
        """
        store, job_id = self.store, job.job_id
        deaths = 0
        while True:
            try:
                engine = self.engine()  # at once while it serves; waits while it (re)starts
            except EngineDeadError as exc:
                if deaths == 0:
                    raise NoEngine(str(exc)) from exc
                self._fail(job_id, exc)  # waiting to run it again, the worker gave up
                raise
            if deaths == 0:
                # one round trip from the message to the engine: queued -> running unless the
                # queue TTL has passed (in the queue, the prefetch buffer or a cold engine's
                # wait), and the record as it now is
                start = store.start(job_id, self.worker)
                if start.overdue:
                    self.expire(job_id)  # unless someone else just ended it: not ours either way
                    raise JobSkipped(f"job {job_id} expired in the queue")
                moved, state, record = start.started, start.state, start.record
            else:
                moved, state = store.transition(job_id, {RUNNING}, RUNNING, {"worker": self.worker})
                record = store.get(job_id) or {}
            if not moved:
                log.info("job %s is %s, not %s: skipping", job_id, state,
                         QUEUED if deaths == 0 else RUNNING)
                raise JobSkipped(f"job {job_id} is {state}")
            streamed: list[bool] = []
            try:
                return self._generate(engine, job, record,
                                      on_first_token=self._first_token(job_id, record, streamed))
            except EngineDeadError as exc:
                deaths += 1
                self.engine_died(engine)
                if deaths >= POISON_DEATHS:
                    log.error("job %s was in flight during %d engine deaths: quarantined",
                              job_id, deaths)
                    self._fail(job_id, PoisonRequest(
                        f"the engine died {deaths} times while running this request; it is "
                        "quarantined and will not be run again"), engine_deaths=deaths)
                    raise
                if streamed:
                    self._fail(job_id, exc, engine_deaths=deaths)
                    raise
                log.warning("job %s: the engine died before its first token; it runs again "
                            "on the restarted engine", job_id)
                moved, state = store.transition(job_id, {RUNNING}, RUNNING,
                                                {"engine_deaths": deaths})
                if not moved:
                    raise JobSkipped(f"job {job_id} is {state}") from exc

    def _first_token(self, job_id: str, record: dict[str, Any],
                     streamed: list[bool]) -> Callable[[], None]:
        """What a job's first output does once it is in the stream (task thread, once): it is
        `streamed`; with prefix affinity on, its offer ends (whichever worker took it: the
        give-up pass ends one whose job never got this far) and this worker's engine now holds
        the job's prefixes (its prefill is done). Neither round trip delays the first token."""
        prefixes = str(record.get("prefixes") or "").split()
        offered = bool(record.get("offered_to"))

        def first_token() -> None:
            streamed.append(True)
            self.prefilled(job_id)
            if self.offers is None:
                return
            try:
                if offered:
                    self.offers.taken(job_id)
                if prefixes:
                    self.offers.remember(prefixes, self.worker)
            except redis.RedisError as exc:  # affinity is a hint: the job goes on
                log.warning("prefix affinity: %s", exc)
        return first_token

    def _fail(self, job_id: str, exc: EngineError, **fields: Any) -> None:
        self.store.transition(job_id, {RUNNING}, FAILED, {"error": exc.to_dict(), **fields})

    def _cancel_poll(self, job_id: str, writer: DeltaWriter) -> Callable[[], bool]:
        """The engine's should_cancel for a running job."""
        next_status = time.monotonic() + STATUS_POLL_S

        def should_cancel() -> bool:
            # Polled every ~50 ms on this thread while the engine works: a good moment to
            # write a batch of output that is due even if nothing new arrived. Any state
            # but running (cancelled, reaped, expired record) means nobody wants the rest;
            # a Redis that does not answer says nothing of the kind, so the job goes on.
            nonlocal next_status
            writer.tick()
            if time.monotonic() < next_status:
                return False
            next_status = time.monotonic() + STATUS_POLL_S
            try:
                return self.store.status(job_id) != RUNNING
            except redis.RedisError:
                return False

        return should_cancel

    def _generate(self, engine: Engine, job: GenerationJob, record: dict[str, Any],
                  on_first_token: Callable[[], None]) -> dict[str, Any]:
        """One run of a running job (`record`: as it was when it started) on `engine`, to its
        terminal state (see run). Its kind (`_Run`) makes the engine call and writes the
        output; the rest, the failure ladder first, is the same for every kind."""
        store, job_id = self.store, job.job_id
        writer = self.writer_for(job_id)
        kind = (_OpenAIRun if job.openai is not None else _NativeRun)(job, record, writer)
        should_cancel = self._cancel_poll(job_id, writer)
        try:
            result = kind.call(engine, should_cancel, on_first_token)
            writer.close()  # the output must be in the stream before the end event
            kind.closed(result)
        except EngineDeadError:
            writer.flush()
            raise  # run() decides: run again, engine_dead or poison_request
        except EngineError as exc:
            self._fail(job_id, exc)
            raise
        except Exception:
            # A bug must not leave the job "running" until it is reaped; its text (which
            # may quote the prompt) goes to the log with the job id, never to the client.
            log.exception("job %s failed with an internal error", job_id)
            self._fail(job_id, InternalJobError(INTERNAL_ERROR_MESSAGE))
            raise
        if result.finish_reason == "cancelled":
            # Aborted in the engine because the job ended (DELETE, client gone, reaped):
            # that already ended the job; this only covers an abort from elsewhere.
            store.transition(job_id, {RUNNING}, CANCELLED, {
                "error": JobCancelled("the request was aborted in the engine").to_dict()})
            raise JobSkipped(f"job {job_id} was aborted in the engine")
        return self._succeed(job_id, kind.body(result), result.ttft_s, result.prompt_tokens)

    def _succeed(self, job_id: str, body: dict[str, Any], ttft_s: float | None,
                 engine_prompt_tokens: int) -> dict[str, Any]:
        """running -> succeeded with `body` as its result (its text, if any, is the stream's),
        through a Redis outage; `body` back, or JobSkipped if the job ended meanwhile."""
        store = self.store
        moved, state = _through_outage(lambda: store.transition(job_id, {RUNNING}, SUCCEEDED, {
            "result": body, "completion_tokens": body["completion_tokens"],
            "ttft_s": None if ttft_s is None else f"{ttft_s:.6f}",
            "engine_prompt_tokens": engine_prompt_tokens}))
        if not moved and state == SUCCEEDED:
            return body  # an earlier try landed; its reply was lost with the connection
        if not moved:
            # Cancelled (or settled) just as it finished: that state stands, and the
            # caller must not record a success that contradicts it.
            log.info("job %s finished but is already %s", job_id, state)
            raise JobSkipped(f"job {job_id} is already {state}")
        return body


class _Run:
    """What differs between a native and an OpenAI job's run: the engine call, what it
    writes to the stream and the result body. The runner's
    `_generate` owns the rest of the lifecycle (vLLM's serving classes share theirs the
    same way)."""

    def __init__(self, job: GenerationJob, record: dict[str, Any], writer: DeltaWriter) -> None:
        self.job, self.record, self.writer = job, record, writer

    def call(self, engine: Engine, should_cancel: Callable[[], bool],
             on_first_token: Callable[[], None]) -> GenerationResult | OpenAIResult:
        """Run it on `engine`, streaming to the writer; `on_first_token` once its first output
        is in the writer (after it: what it does, a Redis round trip with prefix affinity on,
        must not delay the first token's way to the client)."""
        raise NotImplementedError

    def closed(self, result: Any) -> None:
        """The streamed output is in the stream: write what follows it, if anything."""

    def body(self, result: Any) -> dict[str, Any]:
        """The succeeded job's result."""
        raise NotImplementedError


class _NativeRun(_Run):
    """A native job: text deltas."""

    def call(self, engine: Engine, should_cancel: Callable[[], bool],
             on_first_token: Callable[[], None]) -> GenerationResult:
        job, writer = self.job, self.writer
        written: list[bool] = []

        def on_delta(text: str) -> None:
            writer.add(text)
            if not written:
                written.append(True)
                on_first_token()

        return engine.generate(
            job.job_id, job.prompt, {**job.sampling, "max_tokens": job.max_tokens},
            deadline_s=job.deadline_s, on_delta=on_delta,
            should_cancel=should_cancel, add_special_tokens=job.add_special_tokens)

    def body(self, result: GenerationResult) -> dict[str, Any]:
        return {"text": result.text, "completion_tokens": result.completion_tokens,
                "finish_reason": result.finish_reason}


class _OpenAIRun(_Run):
    """An OpenAI job through vLLM's serving layer: its chunks, or its response once done.
    "First token" here means its first chunk (the role) reached the stream; for a
    non-streamed request, its response did (prefix affinity's index learns of it then)."""

    def __init__(self, job: GenerationJob, record: dict[str, Any], writer: DeltaWriter) -> None:
        super().__init__(job, record, writer)
        self._unstreamed: Callable[[], None] = lambda: None  # `call` sets it

    def call(self, engine: Engine, should_cancel: Callable[[], bool],
             on_first_token: Callable[[], None]) -> OpenAIResult:
        job, spec, writer = self.job, self.job.openai or {}, self.writer
        written: list[bool] = []
        self._unstreamed = lambda: None if written else on_first_token()

        def on_chunks(payloads: list[str]) -> None:
            writer.add_chunks(payloads)
            if not written:
                written.append(True)
                on_first_token()

        request = spec.get("request") or {}
        # the base of vLLM's ids the API chose (the caller's, or the job id: openai_request.py)
        base_id = request.get("request_id")
        return engine.openai(
            base_id if isinstance(base_id, str) else job.job_id, spec.get("endpoint", ""), request,
            deadline_s=job.deadline_s,
            extra={"lane": self.record.get("lane"), "max_tokens": job.max_tokens,
                   "max_tokens_capped": bool(spec.get("capped"))},
            on_first_token=writer.write_next_at_once,
            should_cancel=should_cancel, on_chunks=on_chunks)

    def closed(self, result: OpenAIResult) -> None:
        if result.response is not None:
            self.writer.write_response(result.response)
            if result.completion_tokens:  # a non-streamed request's prefill is done all the same
                self._unstreamed()

    def body(self, result: OpenAIResult) -> dict[str, Any]:
        return {"completion_tokens": result.completion_tokens,
                "prompt_tokens": result.prompt_tokens, "finish_reason": result.finish_reason}


def _through_outage(call: Callable[[], Any], outage_s: float = OUTAGE_S) -> Any:
    """`call`, retried on Redis errors for up to `outage_s` (a Redis stall or restart must
    not fail a job whose text is complete); past that, the last error."""
    give_up = time.monotonic() + outage_s
    while True:
        try:
            return call()
        except redis.RedisError:
            if time.monotonic() > give_up:
                raise
            time.sleep(0.5)
