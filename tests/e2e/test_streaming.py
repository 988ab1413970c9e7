"""End to end over real sockets (gunicorn): streaming, resume, cancellation that frees
the engine. Workers and the server come from tests/e2e_fixtures.py."""

from __future__ import annotations

import json
import socket
import time

import pytest
import requests
from e2e_support import EngineHold, engine_stats
from waiting import wait_for

pytestmark = pytest.mark.e2e


def sse_events(resp: requests.Response):
    """Parse SSE from a streaming response, yielding dicts with id/event/data."""
    fields: dict = {}
    for line in resp.iter_lines(decode_unicode=True):
        if line == "":
            if "data" in fields:
                yield {**fields, "data": json.loads(fields["data"])}
            fields = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(": ")
            fields[key] = value


def submit(api_url, **body) -> str:
    resp = requests.post(api_url + "/v1/jobs", json=body, timeout=10)
    assert resp.status_code == 202, resp.text
    return resp.json()["id"]


def engine_is_clean(worker: str) -> dict:
    return wait_for(lambda: (s := engine_stats(worker))["in_flight"] == 0
                      and s["engine_unfinished"] == 0 and s, what=f"{worker} engine idle")


def test_stream_deltas_add_up_to_the_result(api_url):
    job_id = submit(api_url, prompt="解释KV Cache", max_tokens=48, ignore_eos=True)
    with requests.get(f"{api_url}/v1/jobs/{job_id}/stream", stream=True, timeout=60) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = list(sse_events(resp))
    assert events[-1]["event"] == "end" and events[-1]["data"]["status"] == "succeeded"
    job = requests.get(f"{api_url}/v1/jobs/{job_id}", timeout=10).json()
    assert "".join(e["data"]["text"] for e in events[:-1]) == job["result"]["text"]
    assert events[-1]["data"]["completion_tokens"] == job["result"]["completion_tokens"] == 48


def test_last_event_id_replays_exactly_the_missing_events(api_url):
    job_id = submit(api_url, prompt="讲一下深度学习的发展史", max_tokens=600, ignore_eos=True)
    with requests.get(f"{api_url}/v1/jobs/{job_id}/stream", stream=True, timeout=60) as resp:
        full = list(sse_events(resp))
    assert len(full) >= 4, full
    cut = full[1]["id"]
    with requests.get(f"{api_url}/v1/jobs/{job_id}/stream", headers={"Last-Event-ID": cut},
                      stream=True, timeout=60) as resp:
        assert list(sse_events(resp)) == full[2:]


def test_disconnecting_from_a_stream_cancels_and_frees_the_engine(api_url, workers):
    before = engine_stats("long")["aborted"]
    host, port = api_url.removeprefix("http://").split(":")
    with EngineHold(workers, "long") as engine:  # it cannot finish before we hang up
        job_id = submit(api_url, prompt="写一篇1000字的人工智能文章", max_tokens=1500,
                        ignore_eos=True)
        wait_for(lambda: engine_stats("long")["in_flight"], what="the request in the engine")
        # A raw socket: HTTP client libraries keep the connection in a pool on close(); this
        # is what a browser tab or a killed process does.
        with socket.create_connection((host, int(port)), timeout=60) as sock:
            sock.sendall(f"GET /v1/jobs/{job_id}/stream?cancel_on_disconnect=true HTTP/1.1\r\n"
                         f"Host: {host}\r\n\r\n".encode())
            engine.release()  # it decodes while we read its first delta...
            seen = b""
            while b"event: delta" not in seen:
                chunk = sock.recv(65536)
                assert chunk, f"stream ended early: {seen[-500:]!r}"
                seen += chunk
            engine.hold()  # ...and the rest of its 1,500 tokens wait: hang up
        job = wait_for(lambda: (j := requests.get(f"{api_url}/v1/jobs/{job_id}", timeout=10).json())
                         ["status"] != "running" and j, what="job ended")
        assert job["status"] == "cancelled", job
        assert job["error"]["message"] == "the client disconnected"
        stats = engine_is_clean("long")
    assert stats["aborted"] == before + 1


def test_delete_a_running_request_aborts_it_in_the_engine(api_url, workers):
    with EngineHold(workers, "long"):  # it cannot finish before the DELETE
        job_id = submit(api_url, prompt="写一篇1000字的人工智能文章", max_tokens=1500,
                        ignore_eos=True)
        wait_for(lambda: engine_stats("long")["in_flight"], what="the request in the engine")
        resp = requests.delete(f"{api_url}/v1/jobs/{job_id}", timeout=10)
        assert resp.status_code == 200 and resp.json()["status"] == "cancelled"
        engine_is_clean("long")
    # a late SUCCESS never overwrites the cancel
    time.sleep(0.5)
    assert requests.get(f"{api_url}/v1/jobs/{job_id}", timeout=10).json()["status"] == "cancelled"
    again = requests.delete(f"{api_url}/v1/jobs/{job_id}", timeout=10)
    assert again.status_code == 409
