"""An OpenAI job through a real Celery worker, real Redis and a real engine (the session's
workers, tests/e2e_fixtures.py): the task message in, as the API queues it (record and
message in one step, the contract's ``openai`` argument), vLLM's chunks or response and the
end event out of the job's stream. The client -> API -> worker path is tested on top of this
by the API's own tests."""

from __future__ import annotations

import json
import uuid

import pytest
from e2e_support import engine_stats
from waiting import wait_for

from tailguard.jobs.store import SUCCEEDED, TERMINAL, JobStore
from tailguard.jobs.stream import follow, output_text, response_body
from tailguard.jobs.task_message import TaskMessages
from tailguard.lanes.table import load_lanes
from tailguard.model.info import served_model_names

pytestmark = pytest.mark.e2e


def queue_openai_job(store: JobStore, model: str, request: dict, *, lane_name: str = "short",
                     endpoint: str = "chat") -> str:
    """Queue an OpenAI job as the API does: its record and its lane's message in one step."""
    from tasks import app

    lane = load_lanes()[lane_name]
    job_id = uuid.uuid4().hex
    max_tokens = request["max_tokens"]
    kwargs = {"job_id": job_id, "prompt": "", "max_tokens": max_tokens, "sampling": {},
              "deadline_s": lane.deadline_s,
              "openai": {"endpoint": endpoint, "prompt_tokens": 10, "capped": False,
                         "request": {**request, "model": served_model_names(model)[0],
                                     "request_id": job_id}}}
    message = TaskMessages(app).build(lane.task_name, task_id=job_id, queue=lane.queue,
                                      kwargs=kwargs, expires_s=lane.queue_ttl_s)
    store.create(job_id, {"lane": lane.name, "prompt_tokens": 10, "max_tokens": max_tokens,
                          "deadline_s": lane.deadline_s, "cost": 10 + max_tokens,
                          "openai": endpoint},
                 queue_ttl_s=lane.queue_ttl_s, message=(lane.queue, message))
    return job_id


def events_of(store: JobStore, job_id: str, workers) -> list:
    events = []
    for event in follow(store.redis, job_id, heartbeat_s=1.0, status=lambda: store.status(job_id)):
        if event is None:
            workers.check()
            continue
        events.append(event)
    return events


@pytest.fixture
def store(workers, redis_client_noflush) -> JobStore:
    return JobStore(redis_client_noflush)


def test_a_streamed_openai_job_streams_vllms_chunks_then_its_end(store, workers, tiny_model):
    job_id = queue_openai_job(store, tiny_model, {
        "messages": [{"role": "user", "content": "What is a KV cache?"}], "max_tokens": 12,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
    events = events_of(store, job_id, workers)
    assert [e.type for e in events][-1] == "end" and {e.type for e in events[:-1]} == {"chunk"}
    chunks = [json.loads(p) for e in events for p in e.payloads]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert {c["id"] for c in chunks} == {f"chatcmpl-{job_id}"}
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-2]["tailguard"] == {"lane": "short", "max_tokens": 12,
                                       "max_tokens_capped": False, "finish_reason": "length"}
    usage = chunks[-1]["usage"]
    end = events[-1].data
    assert (end["status"], end["finish_reason"]) == (SUCCEEDED, "length")
    assert end["completion_tokens"] == usage["completion_tokens"] == 12
    assert end["prompt_tokens"] == usage["prompt_tokens"]
    job = store.get(job_id)
    assert job["ttft_s"] > 0 and job["worker"].startswith("short@")
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert output_text(store.redis, job_id).text == text
    wait_for(lambda: (s := engine_stats("short"))["in_flight"] == 0 and s["engine_unfinished"] == 0)


def test_a_non_streamed_openai_job_writes_vllms_response(store, workers, tiny_model):
    job_id = queue_openai_job(store, tiny_model, {
        "prompt": "KV caches are", "max_tokens": 6, "ignore_eos": True, "n": 2, "seed": 5,
        "temperature": 1.0}, endpoint="completion")
    events = events_of(store, job_id, workers)
    assert [e.type for e in events] == ["response", "end"]
    body = json.loads(response_body(store.redis, job_id))
    assert body["object"] == "text_completion" and body["id"] == f"cmpl-{job_id}"
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["usage"]["completion_tokens"] == events[-1].data["completion_tokens"] == 12
    assert output_text(store.redis, job_id).text == body["choices"][0]["text"]
    assert store.status(job_id) in TERMINAL


def test_a_refused_openai_job_fails_with_a_400_code(store, workers, tiny_model):
    job_id = queue_openai_job(store, tiny_model, {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True,
        "structured_outputs": {"regex": "(unclosed"}})
    end = events_of(store, job_id, workers)[-1].data
    assert end["status"] == "failed" and end["error"]["code"] == "engine_refused"
