"""The job lifecycle of tailguard/worker/runner.py against a real Redis, with an in-process fake
engine (the e2e tier runs the same runner on a real engine inside real workers)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tailguard.engine.host import GenerationResult
from tailguard.errors import EngineDeadError, EngineError
from tailguard.jobs.store import CANCELLED, QUEUED, RUNNING, JobStore
from tailguard.jobs.stream import DeltaWriter, read_events
from tailguard.worker.runner import GenerationJob, JobRunner, JobSkipped, NoEngine

pytestmark = pytest.mark.integration

JOB_ID = "ab" * 16


class FakeEngine:
    """Streams `deltas` (polling should_cancel between them) or raises `error`."""

    def __init__(self, deltas: list[str] = ("a", "b", "c"), error: BaseException | None = None,
                 during: Callable[[], None] | None = None) -> None:
        self.deltas, self.error, self.during = list(deltas), error, during
        self.calls: list[tuple[str, str, dict]] = []

    def generate(self, request_id, prompt, sampling, deadline_s, on_first_token=None,
                 should_cancel=None, on_delta=None, add_special_tokens=True) -> GenerationResult:
        self.calls.append((request_id, prompt, sampling))
        if self.error is not None:
            raise self.error
        sent: list[str] = []
        for text in self.deltas:
            if self.during is not None:
                self.during()
            if should_cancel is not None and should_cancel():
                return GenerationResult("".join(sent), 3, len(sent), "cancelled", 0.01, 0.02)
            sent.append(text)
            if on_delta is not None:
                on_delta(text)
        return GenerationResult("".join(sent), 3, len(sent), "length", 0.01, 0.02)


@pytest.fixture
def store(redis_client) -> JobStore:
    return JobStore(redis_client)


def runner_for(store: JobStore, engine: FakeEngine) -> JobRunner:
    return JobRunner(lambda: engine, store, lambda job_id: DeltaWriter(store.redis, job_id, flush_s=0),
                     worker="test@host")


def queue_job(store: JobStore, queue_ttl_s: float = 60) -> GenerationJob:
    store.create(JOB_ID, {"lane": "short", "deadline_s": 5}, queue_ttl_s=queue_ttl_s)
    return GenerationJob(JOB_ID, "hi", max_tokens=3, sampling={"temperature": 0}, deadline_s=5)


def test_a_job_runs_streams_and_succeeds(store):
    engine = FakeEngine()
    body = runner_for(store, engine).run(queue_job(store))
    assert body == {"text": "abc", "completion_tokens": 3, "finish_reason": "length"}
    assert engine.calls == [(JOB_ID, "hi", {"temperature": 0, "max_tokens": 3})]
    job = store.get(JOB_ID)
    assert job["status"] == "succeeded" and job["worker"] == "test@host"
    # the text's one copy is the stream; the record keeps how the job ended
    assert job["result"] == {"completion_tokens": 3, "finish_reason": "length"}
    assert job["engine_prompt_tokens"] == 3
    events = read_events(store.redis, JOB_ID)
    assert "".join(e.data["text"] for e in events if e.type == "delta") == "abc"
    assert events[-1].type == "end" and events[-1].data["status"] == "succeeded"


def test_the_worker_is_told_once_a_jobs_prefill_is_done_at_its_first_token(store):
    # the lane gate's prefill bound (tailguard/worker/lane_gate.py) releases the job's prompt then
    told: list[str] = []
    seen_at: list[int] = []
    engine = FakeEngine(during=lambda: seen_at.append(len(told)))
    JobRunner(lambda: engine, store, lambda job_id: DeltaWriter(store.redis, job_id, flush_s=0),
              worker="test@host", prefilled=told.append).run(queue_job(store))
    assert told == [JOB_ID]
    assert seen_at == [0, 1, 1]  # before the first delta not yet, after it once


def test_a_job_past_its_queue_ttl_expires_without_touching_the_engine(store):
    engine = FakeEngine()
    job = queue_job(store, queue_ttl_s=0.01)
    time.sleep(0.05)
    with pytest.raises(JobSkipped):
        runner_for(store, engine).run(job)
    assert engine.calls == []
    record = store.get(JOB_ID)
    assert record["status"] == "expired" and record["error"]["code"] == "expired"


@pytest.mark.parametrize("state", [RUNNING, CANCELLED])
def test_a_job_that_is_not_queued_is_skipped(store, state):
    # RUNNING: a redelivered duplicate; CANCELLED: cancelled while queued
    engine = FakeEngine()
    job = queue_job(store)
    store.transition(JOB_ID, {QUEUED}, state)
    with pytest.raises(JobSkipped):
        runner_for(store, engine).run(job)
    assert engine.calls == [] and store.status(JOB_ID) == state


def test_a_cancel_while_running_stops_the_engine_and_stands(store):
    def cancel_after_first_delta() -> None:
        if store.get(JOB_ID).get("worker") and read_events(store.redis, JOB_ID):
            store.transition(JOB_ID, {RUNNING}, CANCELLED, {"error": {"code": "cancelled",
                                                                      "message": "by test"}})

    engine = FakeEngine(deltas=["a", "b", "c", "d"], during=cancel_after_first_delta)
    with pytest.raises(JobSkipped):
        runner_for(store, engine).run(queue_job(store))
    job = store.get(JOB_ID)
    assert job["status"] == CANCELLED and "result" not in job


@pytest.mark.parametrize("error, code", [
    (EngineError("the prompt was rejected: boom"), "engine_error"),
    (ValueError("a bug"), "internal_error"),
])
def test_a_failure_ends_the_job_failed_and_propagates(store, error, code):
    with pytest.raises(type(error)):
        runner_for(store, FakeEngine(error=error)).run(queue_job(store))
    job = store.get(JOB_ID)
    assert job["status"] == "failed" and job["error"]["code"] == code
    assert read_events(store.redis, JOB_ID)[-1].data["error"]["code"] == code


def test_internal_errors_do_not_reach_the_client(store):
    with pytest.raises(ValueError):
        runner_for(store, FakeEngine(error=ValueError("secret prompt text"))).run(queue_job(store))
    assert "secret" not in store.get(JOB_ID)["error"]["message"]


class DyingEngine(FakeEngine):
    """Dies (EngineDeadError) on its first `deaths` calls, after streaming `before` deltas."""

    def __init__(self, deaths: int, before: list[str] = ()) -> None:
        super().__init__()
        self.deaths, self.before = deaths, list(before)

    def generate(self, request_id, prompt, sampling, deadline_s, on_first_token=None,
                 should_cancel=None, on_delta=None, add_special_tokens=True):
        if len(self.calls) < self.deaths:
            self.calls.append((request_id, prompt, sampling))
            for text in self.before:
                if on_first_token is not None:  # optional, as the real engine has it
                    on_first_token()
                on_delta(text)
            raise EngineDeadError("the vLLM engine is dead")
        return super().generate(request_id, prompt, sampling, deadline_s, on_first_token,
                                should_cancel, on_delta, add_special_tokens)


def dying_runner(store, engine):
    died = []
    runner = JobRunner(lambda: engine, store,
                       lambda job_id: DeltaWriter(store.redis, job_id, flush_s=0),
                       worker="test@host", engine_died=died.append)
    return runner, died


def test_an_engine_death_before_the_first_token_runs_the_job_again(store):
    engine = DyingEngine(deaths=1)
    runner, died = dying_runner(store, engine)
    assert runner.run(queue_job(store))["text"] == "abc"
    assert len(engine.calls) == 2 and died == [engine]
    job = store.get(JOB_ID)
    assert job["status"] == "succeeded" and job["engine_deaths"] == 1


def test_an_engine_death_after_a_token_fails_the_job_engine_dead(store):
    engine = DyingEngine(deaths=1, before=["a"])
    runner, died = dying_runner(store, engine)
    with pytest.raises(EngineDeadError):
        runner.run(queue_job(store))
    assert len(engine.calls) == 1 and died == [engine]
    job = store.get(JOB_ID)
    assert (job["status"], job["error"]["code"], job["engine_deaths"]) == ("failed", "engine_dead", 1)


def test_a_job_in_flight_during_two_engine_deaths_is_quarantined(store):
    engine = DyingEngine(deaths=5)
    runner, _ = dying_runner(store, engine)
    with pytest.raises(EngineDeadError):
        runner.run(queue_job(store))
    assert len(engine.calls) == 2  # never a third time
    job = store.get(JOB_ID)
    assert (job["status"], job["error"]["code"], job["engine_deaths"]) == \
        ("failed", "poison_request", 2)
    assert read_events(store.redis, JOB_ID)[-1].data["error"]["code"] == "poison_request"


@pytest.mark.parametrize("ended", ["failed", "expired", CANCELLED])
def test_any_end_of_a_running_job_stops_its_engine_request(store, ended):
    def end_it() -> None:
        if store.status(JOB_ID) == RUNNING and read_events(store.redis, JOB_ID):
            store.transition(JOB_ID, {RUNNING}, ended, {"error": {"code": "x", "message": "m"}})

    engine = FakeEngine(deltas=["a", "b", "c", "d"], during=end_it)
    with pytest.raises(JobSkipped):
        runner_for(store, engine).run(queue_job(store))
    job = store.get(JOB_ID)
    assert job["status"] == ended and "result" not in job


def test_a_job_is_marked_running_only_once_the_engine_is_ready(store):
    seen = []

    def engine():
        seen.append(store.status(JOB_ID))  # while the worker waits for its engine
        return FakeEngine()

    JobRunner(engine, store, lambda job_id: DeltaWriter(store.redis, job_id, flush_s=0),
              worker="test@host").run(queue_job(store))
    assert seen == [QUEUED] and store.status(JOB_ID) == "succeeded"


def test_a_worker_without_an_engine_leaves_the_job_queued(store):
    def engine():
        raise EngineDeadError("the worker is stopping")

    with pytest.raises(NoEngine):
        JobRunner(engine, store, lambda job_id: DeltaWriter(store.redis, job_id, flush_s=0),
                  worker="test@host").run(queue_job(store))
    assert store.status(JOB_ID) == QUEUED
