"""Cancellation and the per-job output stream, against a real Redis with no engine:
the stream is written with the worker's own DeltaWriter and ended by the job state
machine, exactly as a worker does."""

import json

import pytest

from tailguard.jobs.store import QUEUED, RUNNING, SUCCEEDED, JobStore
from tailguard.jobs.stream import DeltaWriter

pytestmark = pytest.mark.integration


def submit(client, **body):
    resp = client.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 8, **body})
    assert resp.status_code == 202
    return resp.get_json()["id"]


def parse_sse(raw: bytes) -> list[dict]:
    events = []
    for block in raw.decode().split("\n\n"):
        fields = {}
        for line in block.split("\n"):
            if line and not line.startswith(":"):
                key, _, value = line.partition(": ")
                fields[key] = value
        if fields:
            events.append({**fields, "data": json.loads(fields["data"])})
    return events


def test_cancel_a_queued_job(client):
    job_id = submit(client)
    resp = client.delete(f"/v1/jobs/{job_id}")
    assert resp.status_code == 200 and resp.get_json()["status"] == "cancelled"
    assert client.get(f"/v1/jobs/{job_id}").get_json()["error"]["code"] == "cancelled"
    again = client.delete(f"/v1/jobs/{job_id}")
    assert again.status_code == 409
    assert again.get_json()["error"]["code"] == "conflict"
    assert "already ended (cancelled)" in again.get_json()["error"]["message"]


def test_cancel_unknown_job_is_a_404(client):
    assert client.delete("/v1/jobs/" + "0" * 32).status_code == 404
    assert client.delete("/v1/jobs/nope").status_code == 404


def finish_like_a_worker(redis_client, job_id, deltas, *, flush_s=0.0):
    """What tasks/generate.py does around the engine: deltas, then the terminal state."""
    store = JobStore(redis_client)
    store.transition(job_id, {QUEUED}, RUNNING, {"worker": "test@host"})
    writer = DeltaWriter(redis_client, job_id, flush_s=flush_s)
    for d in deltas:
        writer.add(d)
    writer.flush()
    store.transition(job_id, {RUNNING}, SUCCEEDED, {"result": {
        "text": "".join(deltas), "completion_tokens": len(deltas), "finish_reason": "length"}})
    return writer


def test_stream_replays_deltas_then_the_end_event(client, redis_client):
    job_id = submit(client)
    finish_like_a_worker(redis_client, job_id, ["Hel", "lo", " wor", "ld"])
    resp = client.get(f"/v1/jobs/{job_id}/stream")
    assert resp.status_code == 200 and resp.mimetype == "text/event-stream"
    events = parse_sse(resp.data)
    assert [e["event"] for e in events] == ["delta"] * 4 + ["end"]
    assert "".join(e["data"]["text"] for e in events[:-1]) == "Hello world"
    assert events[-1]["data"] == {"status": "succeeded", "completion_tokens": 4,
                                  "finish_reason": "length"}
    ids = [e["id"] for e in events]
    assert ids == sorted(ids) and len(set(ids)) == 5


def test_last_event_id_resumes_with_exactly_the_missing_events(client, redis_client):
    job_id = submit(client)
    finish_like_a_worker(redis_client, job_id, ["a", "b", "c", "d"])
    full = parse_sse(client.get(f"/v1/jobs/{job_id}/stream").data)
    resumed = parse_sse(client.get(f"/v1/jobs/{job_id}/stream",
                                   headers={"Last-Event-ID": full[1]["id"]}).data)
    assert resumed == full[2:]
    assert parse_sse(client.get(f"/v1/jobs/{job_id}/stream?after={full[3]['id']}").data) == full[4:]


def test_deltas_are_batched_but_the_first_is_written_at_once(redis_client):
    store = JobStore(redis_client)
    job_id = "aa" * 16
    store.create(job_id, {"lane": "short"}, queue_ttl_s=60)
    writer = DeltaWriter(redis_client, job_id, flush_s=60.0)
    writer.add("first")
    assert writer.entries == 1  # time to first token is not held back
    for t in ("a", "b", "c"):
        writer.add(t)
    writer.tick()
    assert writer.entries == 1  # batched: the window has not passed
    writer.flush()
    assert writer.entries == 2
    assert 0 < redis_client.ttl(f"tailguard:job:{job_id}:stream") <= 86400


def test_a_write_retried_after_its_reply_was_lost_is_not_doubled(redis_client):
    job_id = "ab" * 16
    writer = DeltaWriter(redis_client, job_id)
    # Redis applied the first write, but the worker never saw the reply (a stall past its
    # socket timeout), so the text is still pending and is written again.
    redis_client.xadd(f"tailguard:job:{job_id}:stream", {"type": "delta", "data": '{"text": "Hel"}'},
                      id="0-1")
    writer.add("Hel")
    writer.add("lo")
    writer.close()
    texts = [json.loads(f[b"data"])["text"]
             for _id, f in redis_client.xrange(f"tailguard:job:{job_id}:stream")]
    assert texts == ["Hel", "lo"]


def test_a_write_while_redis_is_away_stays_pending_until_it_answers(redis_client):
    import redis

    from tailguard.host.redis_server import free_port

    job_id = "ac" * 16
    away = redis.Redis(port=free_port(), socket_connect_timeout=0.2, socket_timeout=0.2)
    writer = DeltaWriter(away, job_id, outage_s=0.3)
    writer.add("kept")  # no exception: the engine does not wait for Redis
    assert writer.entries == 0
    with pytest.raises(redis.ConnectionError):
        writer.close()  # the write that must land gives up only after outage_s
    writer.client = redis_client  # Redis is back
    writer.add(" and more")
    writer.close()
    texts = [json.loads(f[b"data"])["text"]
             for _id, f in redis_client.xrange(f"tailguard:job:{job_id}:stream")]
    assert texts == ["kept and more"]


def test_stream_of_a_cancelled_job_ends_with_cancelled(client):
    job_id = submit(client)
    client.delete(f"/v1/jobs/{job_id}")
    [end] = parse_sse(client.get(f"/v1/jobs/{job_id}/stream").data)
    assert end["event"] == "end" and end["data"]["status"] == "cancelled"


def test_stream_of_a_job_nobody_serves_ends_expired(client):
    # batch.queue_ttl_s is 3 s and no worker runs: the stream's idle heartbeats settle it
    job_id = submit(client, priority="batch")
    events = parse_sse(client.get(f"/v1/jobs/{job_id}/stream").data)
    assert events[-1]["event"] == "end" and events[-1]["data"]["status"] == "expired"
    assert events[-1]["data"]["error"]["code"] == "expired"


def test_bad_last_event_id_and_unknown_job(client):
    job_id = submit(client)
    resp = client.get(f"/v1/jobs/{job_id}/stream", headers={"Last-Event-ID": "yesterday"})
    assert resp.status_code == 400 and resp.get_json()["error"]["field"] == "Last-Event-ID"
    assert client.get("/v1/jobs/" + "0" * 32 + "/stream").status_code == 404


def test_a_last_event_id_at_or_past_the_end_ends_the_stream(client, redis_client):
    job_id = submit(client)
    finish_like_a_worker(redis_client, job_id, ["a", "b"])
    end_id = parse_sse(client.get(f"/v1/jobs/{job_id}/stream").data)[-1]["id"]
    assert parse_sse(client.get(f"/v1/jobs/{job_id}/stream",
                                headers={"Last-Event-ID": end_id}).data) == []
    assert parse_sse(client.get(f"/v1/jobs/{job_id}/stream?after=99999999999999-0").data) == []


def test_a_record_that_vanishes_ends_the_stream_with_an_error_event(client, redis_client):
    job_id = submit(client)
    resp = client.get(f"/v1/jobs/{job_id}/stream")  # the view ran; the body is read below
    redis_client.delete(f"tailguard:job:{job_id}")  # as if its TTL ran out mid-follow
    [event] = parse_sse(resp.data)
    assert event["event"] == "error" and event["data"]["error"]["code"] == "not_found"


def test_redis_down_is_a_fast_503_with_retry_after_on_every_route(tiny_model, redis_client):
    from app import create_app
    from tailguard.host.redis_server import free_port

    down = create_app({"TESTING": True, "TAILGUARD_MODEL": tiny_model,
                       "TAILGUARD_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
                       "TAILGUARD_CONSUME_FINISHED": False,
                       "TAILGUARD_REAP_RUNNING": False}).test_client()
    job = "ab" * 16
    for method, path, body in [("post", "/v1/jobs", {"prompt": "hi"}), ("get", f"/v1/jobs/{job}", None),
                               ("get", f"/v1/jobs/{job}/stream", None), ("delete", f"/v1/jobs/{job}", None),
                               ("get", "/healthz", None),
                               ("post", "/v1/completions", {"model": tiny_model, "prompt": "hi"})]:
        resp = getattr(down, method)(path, json=body)
        assert resp.status_code == 503, path
        assert resp.headers["Retry-After"].isdigit(), path
        assert "broker_unavailable" in resp.get_data(as_text=True), path
