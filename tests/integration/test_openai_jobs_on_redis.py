"""OpenAI jobs on the worker (tailguard/worker/runner.py) against a real Redis: their stream
(vLLM's chunks or its response, then the end event: tailguard/jobs/stream.py), their
failures and engine deaths. The engine is a
stand-in replaying vLLM's payloads; the same runner on a real engine inside a real worker:
tests/e2e/test_openai_serving_on_an_engine.py."""

from __future__ import annotations

import json
import threading

import pytest
from waiting import wait_for

from tailguard.engine.host import OpenAIResult
from tailguard.errors import EngineDeadError, EngineRefused
from tailguard.jobs.store import RUNNING, SUCCEEDED, JobStore
from tailguard.jobs.stream import (
    DeltaWriter,
    choice0_text,
    output_text,
    read_events,
    response_body,
    with_output,
)
from tailguard.redis.keys import job_stream_key
from tailguard.worker.runner import GenerationJob, JobRunner, JobSkipped

pytestmark = pytest.mark.integration

JOB_ID = "cd" * 16


def chunk(content: str | None = None, finish: str | None = None, role: str | None = None,
          index: int = 0) -> str:
    delta = {k: v for k, v in (("role", role), ("content", content)) if v is not None}
    return json.dumps({"id": f"chatcmpl-{JOB_ID}", "object": "chat.completion.chunk",
                       "created": 1, "model": "m", "choices": [
                           {"index": index, "delta": delta, "logprobs": None,
                            "finish_reason": finish}]}, separators=(",", ":"))


STREAM = [chunk(role="assistant", content=""), chunk("Hel"), chunk("lo"),
          chunk(index=1, content="other choice"), chunk("", finish="length")]
RESPONSE = json.dumps({"id": f"chatcmpl-{JOB_ID}", "object": "chat.completion", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "Hello"}, "finish_reason": "stop"},
    {"index": 1, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}})


class FakeOpenAIEngine:
    """Hands a streamed request's `payloads` on one at a time (polling should_cancel between
    them), waits for `release` when it is given, then answers `response`, or raises `error`
    (or EngineDeadError, on its first `deaths` calls)."""

    def __init__(self, payloads=(), response: str | None = None,
                 error: BaseException | None = None, release: threading.Event | None = None,
                 deaths: int = 0) -> None:
        self.payloads, self.response, self.error = list(payloads), response, error
        self.release, self.deaths = release, deaths
        self.calls: list[dict] = []
        self.in_flight = 0

    def openai(self, request_id, endpoint, request, deadline_s, extra=None, on_first_token=None,
               should_cancel=None, on_chunks=None, priority=0) -> OpenAIResult:
        self.calls.append({"request_id": request_id, "endpoint": endpoint, "request": request,
                           "extra": extra, "priority": priority, "deadline_s": deadline_s})
        self.in_flight += 1
        try:
            # as vLLM's serving layer: chunks for a streamed request only
            for i, payload in enumerate(self.payloads if request.get("stream") else ()):
                if should_cancel():
                    return OpenAIResult(None, 5, i, "cancelled", None, 0.02)
                on_chunks([payload])
                if i == 1:
                    on_first_token()
            if self.release is not None:
                while not self.release.wait(0.02):
                    if should_cancel():
                        return OpenAIResult(None, 5, 1, "cancelled", None, 0.02)
            if len(self.calls) <= self.deaths:
                raise EngineDeadError("the vLLM engine is dead")
            if self.error is not None:
                raise self.error
            return OpenAIResult(self.response, 5, 3, "stop" if self.response else "length",
                                0.01, 0.02)
        finally:
            self.in_flight -= 1


def openai_spec(stream: bool, capped: bool = False) -> dict:
    return {"endpoint": "chat", "capped": capped, "prompt_tokens": 5,
            "request": {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 16, "n": 2, "stream": stream, "request_id": JOB_ID}}


@pytest.fixture
def store(redis_client) -> JobStore:
    return JobStore(redis_client)


def runner_for(store: JobStore, engine, died=None) -> JobRunner:
    return JobRunner(lambda: engine, store,
                     lambda job_id: DeltaWriter(store.redis, job_id, flush_s=0, ttl_s=store.ttl_s),
                     worker="test@host", engine_died=(died.append if died is not None
                                                      else lambda engine: None))


def queue_job(store: JobStore, stream: bool, job_id: str = JOB_ID, lane: str = "short",
              capped: bool = False) -> GenerationJob:
    store.create(job_id, {"lane": lane, "deadline_s": 5, "prompt_tokens": 5}, queue_ttl_s=60)
    return GenerationJob(job_id, "", max_tokens=16, sampling={}, deadline_s=5,
                         openai=openai_spec(stream, capped))


def test_a_streamed_job_writes_vllms_chunks_in_order_then_its_end(store):
    engine = FakeOpenAIEngine(STREAM)
    body = runner_for(store, engine).run(queue_job(store, stream=True, capped=True))
    assert body == {"completion_tokens": 3, "prompt_tokens": 5, "finish_reason": "length"}
    (call,) = engine.calls
    assert call["request"] == openai_spec(True)["request"] and call["endpoint"] == "chat"
    assert call["extra"] == {"lane": "short", "max_tokens": 16, "max_tokens_capped": True}
    events = read_events(store.redis, JOB_ID)
    assert {e.type for e in events} == {"chunk", "end"} and events[-1].type == "end"
    assert [p for e in events for p in e.payloads] == STREAM  # verbatim, in order
    end = events[-1].data
    assert (end["status"], end["finish_reason"], end["completion_tokens"], end["prompt_tokens"]) \
        == (SUCCEEDED, "length", 3, 5)
    job = store.get(JOB_ID)
    assert job["ttft_s"] == pytest.approx(0.01) and job["engine_prompt_tokens"] == 5
    # the one copy of the output is the stream; GET shows choice 0's text
    assert "text" not in job["result"]
    assert output_text(store.redis, JOB_ID).text == "Hello"
    assert with_output(store.redis, JOB_ID, job)["result"]["text"] == "Hello"


def test_a_non_streamed_job_writes_one_response_before_its_end(store):
    body = runner_for(store, FakeOpenAIEngine(response=RESPONSE)).run(queue_job(store, stream=False))
    assert body["finish_reason"] == "stop"
    events = read_events(store.redis, JOB_ID)
    assert [e.type for e in events] == ["response", "end"]
    assert response_body(store.redis, JOB_ID) == RESPONSE
    assert output_text(store.redis, JOB_ID).text == "Hello"


def test_the_stream_keeps_its_ttl_while_the_job_runs_and_the_outputs_once_it_ended(store):
    release = threading.Event()
    runner = runner_for(store, FakeOpenAIEngine(STREAM[:2], release=release))
    thread = threading.Thread(target=runner.run, args=(queue_job(store, stream=True),))
    thread.start()
    key = job_stream_key(JOB_ID)
    try:
        wait_for(lambda: read_events(store.redis, JOB_ID))
        assert store.output_ttl_s < store.redis.ttl(key) <= store.ttl_s  # the job's life
    finally:
        release.set()
        thread.join(10)
    assert store.status(JOB_ID) == SUCCEEDED
    assert 0 < store.redis.ttl(key) <= store.output_ttl_s  # from its end: the output's


def test_chunks_are_batched_into_entries_by_the_writers_interval(redis_client):
    writer = DeltaWriter(redis_client, JOB_ID, flush_s=60)
    writer.add_chunks(STREAM[:1])  # the first entry: at once
    writer.write_next_at_once()  # the first text follows at once too
    writer.add_chunks(STREAM[1:2])
    writer.add_chunks(STREAM[2:3])
    writer.add_chunks(STREAM[3:])
    writer.close()
    events = read_events(redis_client, JOB_ID)
    assert [e.payloads for e in events] == [STREAM[:1], STREAM[1:2], STREAM[2:]]
    assert choice0_text([p for e in events for p in e.payloads]) == "Hello"


def test_a_refusal_by_vllms_serving_layer_fails_the_job_with_a_400_code(store):
    engine = FakeOpenAIEngine(error=EngineRefused("grammar does not compile", field="response_format"))
    with pytest.raises(EngineRefused):
        runner_for(store, engine).run(queue_job(store, stream=False))
    job = store.get(JOB_ID)
    assert job["status"] == "failed"
    assert job["error"] == {"code": "engine_refused", "message": "grammar does not compile",
                            "field": "response_format"}
    assert read_events(store.redis, JOB_ID)[-1].data["error"]["code"] == "engine_refused"


def test_an_engine_death_before_any_chunk_runs_the_job_again(store):
    died: list = []
    engine = FakeOpenAIEngine(response=RESPONSE, deaths=1)
    runner_for(store, engine, died).run(queue_job(store, stream=False))
    assert len(engine.calls) == 2 and died == [engine]
    assert store.get(JOB_ID)["engine_deaths"] == 1
    assert [e.type for e in read_events(store.redis, JOB_ID)] == ["response", "end"]


def test_an_engine_death_after_the_role_chunk_fails_the_job_engine_dead(store):
    engine = FakeOpenAIEngine(STREAM[:1], deaths=1)
    with pytest.raises(EngineDeadError):
        runner_for(store, engine).run(queue_job(store, stream=True))
    assert len(engine.calls) == 1  # a second run would show the client a second role chunk
    assert store.get(JOB_ID)["error"]["code"] == "engine_dead"


def test_a_cancel_while_running_stops_the_request_and_stands(store):
    release = threading.Event()
    engine = FakeOpenAIEngine(STREAM[:2], release=release)
    runner = runner_for(store, engine)
    errors: list = []

    def run() -> None:
        try:
            runner.run(queue_job(store, stream=True))
        except JobSkipped as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    wait_for(lambda: store.status(JOB_ID) == RUNNING and read_events(store.redis, JOB_ID))
    store.transition(JOB_ID, {RUNNING}, "cancelled", {"error": {"code": "cancelled", "message": "m"}})
    thread.join(10)
    assert errors and store.status(JOB_ID) == "cancelled"
