"""The load generator retries a refusal (429 or 503) as the openai SDK does by default."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tailguard.bench.loadgen import (
    REFUSED,
    SDK_RETRIES,
    Client,
    Sample,
    retry_delay,
)
from tailguard.bench.workload import BenchRequest


@pytest.mark.parametrize("retries_done, retry_after, jitter, delay", [
    (0, 7.0, 0.9, 7.0),        # Retry-After honoured...
    (1, 60.0, 0.0, 60.0),      # ...up to 60 s
    (0, 61.0, 0.0, 0.5),       # past it: the backoff
    (0, None, 0.0, 0.5),       # none: 0.5 s,
    (1, None, 0.0, 1.0),       # doubled per retry made,
    (5, None, 0.0, 8.0),       # at most 8 s,
    (0, None, 1.0, 0.375),     # less up to a quarter
    (0, 0.0, 0.0, 0.5),        # Retry-After 0 is not a delay the SDK takes
])
def test_retry_delay_is_the_sdks(retries_done, retry_after, jitter, delay):
    assert retry_delay(retries_done, retry_after, jitter) == pytest.approx(delay)


def test_the_sdk_retries_twice_by_default():
    assert SDK_RETRIES == 2


@pytest.fixture
def flaky_server():
    """Refuses the first `server.refusals` completions (each status in turn, Retry-After 0.01 s),
    then streams one chunk; records the priority each request carried."""
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            self.server.priorities.append(body.get("priority"))
            if self.server.refusals:
                status = self.server.refusals.pop(0)
                out = json.dumps({"error": {"message": "busy", "code": status}}).encode()
                self.send_response(status)
                self.send_header("Retry-After", "0.01")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)
                return
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()
            chunk = {"choices": [{"text": "a", "finish_reason": "length"}],
                     "usage": {"completion_tokens": 1, "prompt_tokens": 1}}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode())

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.refusals, server.priorities = [], []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def send(server, retries):
    client = Client(f"http://127.0.0.1:{server.server_port}", "m", jobs=False,
                    priorities={"short": 0, "long": 1}, retries=retries)
    sample = Sample("long", 1, 0.0)
    client.stream(BenchRequest("long", "p", 1, 0.0), sample, 0.0, float("inf"))
    return sample


def test_a_refused_request_is_sent_again_and_timed_from_its_first_send(flaky_server):
    flaky_server.refusals = [429, 503]
    s = send(flaky_server, retries=2)
    assert s.ok and s.status == "succeeded" and s.attempts == 3 and len(s.refused_at) == 2
    assert s.http_status == 200 and s.refusal is None and s.error is None
    assert s.e2e_s >= 0.02  # both Retry-After waits are inside its latency
    assert flaky_server.priorities == [1, 1, 1]  # the class's vLLM priority every time


def test_past_its_retries_a_request_stays_refused_with_the_last_answer(flaky_server):
    flaky_server.refusals = [429, 429, 503]
    s = send(flaky_server, retries=2)
    assert (s.status, s.http_status, s.refusal, s.attempts) == (REFUSED, 503, "503", 3)
    assert not s.ok and not s.accepted and len(s.refused_at) == 3


def test_without_retries_a_refusal_is_final(flaky_server):
    flaky_server.refusals = [503]
    s = send(flaky_server, retries=0)
    assert (s.status, s.http_status, s.attempts, len(flaky_server.priorities)) == (REFUSED, 503, 1, 1)
