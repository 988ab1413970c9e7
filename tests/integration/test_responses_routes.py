"""POST /v1/responses (OpenAI's Responses API) against a real Redis with vLLM's real render layer
and no worker: what a request becomes, what is refused before a job exists (nothing is stored
here), and the relay of a worker's Responses events as vLLM's server frames them."""

from __future__ import annotations

import base64
import json

import pytest

from tailguard.gateway.openai_request import RESPONSES_REFUSED
from tailguard.jobs.store import RUNNING, SUCCEEDED, JobStore
from tailguard.jobs.stream import DeltaWriter

pytestmark = pytest.mark.integration


def queued_kwargs(redis_client, lane: str, job_id: str) -> dict:
    for raw in redis_client.lrange(lane, 0, -1):
        message = json.loads(raw)
        if message["headers"]["id"] == job_id:
            return json.loads(base64.b64decode(message["body"]))[1]
    raise AssertionError(f"job {job_id} is not queued on {lane}")


def test_a_response_is_queued_with_its_output_limit_granted_and_vllms_id(client, redis_client):
    resp = client.post("/v1/responses", json={
        "model": "tailguard-demo", "input": "Say hi.", "instructions": "Be brief.",
        "max_output_tokens": 8, "stream": True}, buffered=False)
    assert resp.status_code == 200, resp.get_data(as_text=True)[:500]
    job_id = resp.headers["X-Tailguard-Job-Id"]
    resp.close()
    assert resp.headers["X-Tailguard-Lane"] == "short"
    spec = queued_kwargs(redis_client, "short", job_id)["openai"]
    assert spec["endpoint"] == "responses" and spec["prompt_tokens"] > 3
    request = spec["request"]
    assert (request["max_output_tokens"], request["request_id"], request["instructions"]) == (
        8, f"resp_{job_id}", "Be brief.")
    assert "max_tokens" not in request  # not a field of vLLM's ResponsesRequest
    job = JobStore(redis_client).get(job_id)
    assert (job["openai"], job["request_id"], job["max_tokens"]) == (
        "responses", f"resp_{job_id}", 8)


@pytest.mark.parametrize(("field", "value"), [
    ("previous_response_id", "resp_abc"), ("store", True), ("background", True)])
def test_what_needs_a_stored_response_is_a_400_before_queueing(client, redis_client, field, value):
    before = redis_client.llen("short")
    resp = client.post("/v1/responses", json={"input": "hi", "store": False, field: value})
    assert resp.status_code == 400
    error = resp.get_json()["error"]
    assert error["param"] == field and RESPONSES_REFUSED[field] in error["message"]
    assert redis_client.llen("short") == before


def test_store_false_and_a_body_request_id_are_served(client, redis_client):
    resp = client.post("/v1/responses", json={"input": "hi", "store": False, "stream": True,
                                              "request_id": "resp_mine"}, buffered=False)
    assert resp.status_code == 200, resp.get_data(as_text=True)[:300]
    job_id = resp.headers["X-Tailguard-Job-Id"]
    resp.close()
    assert JobStore(redis_client).get(job_id)["request_id"] == "resp_mine"


def event(kind: str, **fields) -> str:
    return json.dumps({**fields, "sequence_number": 0, "type": kind}, separators=(",", ":"))


def test_a_stream_relays_vllms_events_named_by_type_without_done(client, redis_client):
    resp = client.post("/v1/responses", json={"input": "hi", "max_output_tokens": 4,
                                              "stream": True}, buffered=False)
    job_id = resp.headers["X-Tailguard-Job-Id"]
    store = JobStore(redis_client)
    assert store.start(job_id, "worker@test").started
    writer = DeltaWriter(redis_client, job_id)
    payloads = [event("response.created", response={"id": f"resp_{job_id}"}),
                event("response.output_text.delta", delta="Hel"),
                event("response.output_text.delta", delta="lo"),
                event("response.completed", response={"id": f"resp_{job_id}"})]
    writer.add_chunks(payloads)
    writer.close()
    store.transition(job_id, {RUNNING}, SUCCEEDED, {"result": {
        "finish_reason": "stop", "completion_tokens": 2, "text": "Hello"}})
    blocks = [b for b in b"".join(resp.response).decode().split("\n\n")
              if b and not b.startswith(":")]  # heartbeats aside
    assert blocks == [f"event: {json.loads(p)['type']}\ndata: {p}" for p in payloads]
    job = client.get(f"/v1/jobs/{job_id}").get_json()
    assert job["status"] == SUCCEEDED and job["result"]["text"] == "Hello"
