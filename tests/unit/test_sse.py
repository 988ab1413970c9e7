"""The one SSE framing of native and OpenAI streams."""

import json

import pytest

from app.errors import error_body
from app.sse import DONE, sse_event


def test_json_event_is_one_compact_line():
    assert sse_event({"a": "é\n", "b": [1, None]}) == 'data: {"a":"é\\n","b":[1,null]}\n\n'.encode()


def test_openai_terminator():
    assert sse_event(DONE) == b"data: [DONE]\n\n"


def test_native_event_with_id_and_type():
    assert sse_event({"text": "x"}, event="delta", id="1-0") == \
        b'id: 1-0\nevent: delta\ndata: {"text":"x"}\n\n'


def test_raw_text_over_several_lines():
    assert sse_event("a\nb") == b"data: a\ndata: b\n\n"


def test_error_event_parses_back():
    # mid-stream failures go out as an SSE event the openai client raises on
    event = sse_event(error_body("engine died", type="server_error", param=None, code="engine_error"))
    assert json.loads(event.decode().removeprefix("data: "))["error"]["code"] == "engine_error"


def test_only_a_departed_client_counts_as_a_disconnect():
    from flask import Flask

    from app.sse import sse_response

    def failing():
        yield b"data: 1\n\n"
        raise ConnectionError("Redis went away")

    cancelled = []
    with Flask(__name__).test_request_context():
        body = sse_response(failing(), on_disconnect=lambda: cancelled.append(1)).response
        assert next(body) == b"data: 1\n\n"
        with pytest.raises(ConnectionError):
            next(body)
        assert cancelled == []  # a Redis error is not the client leaving
        gone = sse_response(iter([b"a", b"b"]), on_disconnect=lambda: cancelled.append(2)).response
        next(gone)
        gone.close()  # what gunicorn does when a write to the client fails
        assert cancelled == [2]
