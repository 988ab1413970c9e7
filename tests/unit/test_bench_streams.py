"""The load generator's view of a stream: first token, chunks with text, the gaps between them."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tailguard.bench import loadgen
from tailguard.bench.loadgen import Client, run_phase, run_sessions
from tailguard.bench.sessions import Session, Turn, turn_prompt
from tailguard.bench.workload import BenchRequest

#: What the server streams: (seconds to wait first, the SSE line).
STREAM = [
    (0.0, {"choices": [{"index": 0, "text": "Hello"}]}),
    (0.02, {"choices": [{"index": 0, "text": " wor"}]}),
    (0.0, ": keep-alive"),  # an SSE comment: not a chunk
    (0.02, {"choices": [{"index": 0, "text": "ld", "finish_reason": None}]}),
    (0.0, {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}),  # no text
    (0.0, {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 4}}),
    (0.0, "[DONE]"),
]


@pytest.fixture
def streaming_server():
    """A plain OpenAI-style completions stream (as vLLM's server sends it), one line at a time."""
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            self.server.bodies.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("connection", "close")
            self.end_headers()
            for wait, item in self.server.stream:
                time.sleep(wait)
                if isinstance(item, str) and item.startswith(":"):
                    line = f"{item}\n\n"
                else:
                    line = f"data: {item if isinstance(item, str) else json.dumps(item)}\n\n"
                self.wfile.write(line.encode())
                self.wfile.flush()
            self.close_connection = True

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.bodies, server.stream = [], STREAM
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def test_a_stream_is_timed_chunk_by_chunk(streaming_server):
    client = Client(f"http://127.0.0.1:{streaming_server.server_port}", "m", jobs=False)
    reqs = [BenchRequest("short", "p", 4, 0.0, ignore_eos=False, prompt_tokens=7)]
    [s] = run_phase(client, reqs, duration_s=0, drain_s=30)
    assert s.ok and s.status == "succeeded" and s.finish_reason == "length"
    assert s.chunks == 3 and len(s.itl_s) == 2  # text chunks; the gaps between them
    assert all(g > 0 for g in s.itl_s)
    assert s.ttft_s + sum(s.itl_s) <= s.e2e_s  # the gaps lie between the first token and [DONE]
    assert (s.completion_tokens, s.prompt_tokens, s.planned_prompt_tokens) == (4, 7, 7)
    # the request asked for the model's own length
    assert streaming_server.bodies[0]["ignore_eos"] is False


def test_an_output_with_no_text_has_its_first_chunk_as_its_first_token(streaming_server):
    """One token that decodes to no text (a special token, half a character): as vLLM's bench
    serve, the first chunk with a choice is its first token, and there is no gap to time."""
    streaming_server.stream = [
        (0.01, {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}),
        (0.0, {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 1}}),
        (0.0, "[DONE]")]
    client = Client(f"http://127.0.0.1:{streaming_server.server_port}", "m", jobs=False)
    [s] = run_phase(client, [BenchRequest("short", "p", 1, 0.0)], duration_s=0, drain_s=30)
    assert s.ok and s.ttft_s is not None and s.ttft_s <= s.e2e_s
    assert (s.chunks, s.itl_s, s.completion_tokens) == (0, [], 1)


def test_a_plain_server_may_be_silent_while_a_request_waits_in_its_queue(streaming_server,
                                                                         monkeypatch):
    """vLLM's server sends no heartbeat: silence before the first token is its queue, not a
    fault, so only the phase's deadline ends it; the tailguard API's heartbeats make silence a
    fault there."""
    monkeypatch.setattr(loadgen, "READ_TIMEOUT_S", 0.2)
    streaming_server.stream = [(1.0, STREAM[0][1]), *STREAM[1:]]
    url = f"http://127.0.0.1:{streaming_server.server_port}"
    [plain] = run_phase(Client(url, "m", jobs=False), [BenchRequest("short", "p", 4, 0.0)],
                        duration_s=0, drain_s=30)
    assert plain.ok and plain.ttft_s is not None
    [api] = run_phase(Client(url, "m"), [BenchRequest("short", "p", 4, 0.0)], duration_s=0,
                      drain_s=30)
    assert api.status == "client_error" and "timed out" in api.error


def test_a_session_sends_each_turn_on_the_answer_it_streamed(streaming_server):
    """Turn k+1's prompt is turn k's with its answer as streamed ("Hello world"), then the
    next user turn; every turn is sent once the previous one has ended."""
    session = Session(0, 0.0, "SYS", (Turn("one", 4, 0.0), Turn("two", 4, 0.01),
                                      Turn("three", 4, 0.01)))
    client = Client(f"http://127.0.0.1:{streaming_server.server_port}", "m", jobs=False)
    samples = run_sessions(client, [session], duration_s=0, drain_s=30)
    assert [s.ok for s in samples] == [True] * 3 and [s.turn for s in samples] == [0, 1, 2]
    prompts = [b["prompt"] for b in streaming_server.bodies]
    assert prompts == [turn_prompt("SYS", ["one"], []),
                       turn_prompt("SYS", ["one", "two"], ["Hello world"]),
                       turn_prompt("SYS", ["one", "two", "three"], ["Hello world"] * 2)]
    # each turn became due after the previous answer ended
    assert samples[1].arrival_s >= samples[0].sent_s + samples[0].e2e_s


def test_a_session_whose_turn_failed_sends_no_more(streaming_server):
    streaming_server.stream = [(0.0, {"error": {"message": "boom"}}), (0.0, "[DONE]")]
    session = Session(0, 0.0, "SYS", (Turn("one", 4, 0.0), Turn("two", 4, 0.0)))
    client = Client(f"http://127.0.0.1:{streaming_server.server_port}", "m", jobs=False)
    first, second = run_sessions(client, [session], duration_s=0, drain_s=30)
    assert not first.ok and second.status == "not_sent" and "turn 0" in second.error
    assert len(streaming_server.bodies) == 1
