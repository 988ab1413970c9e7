"""The one SSE framing of native and OpenAI streams."""

import json

from app.sse import sse_event
from tailguard.openai_protocol import STREAM_DONE, error_body


def test_json_event_is_one_compact_line():
    assert sse_event({"a": "é\n", "b": [1, None]}) == 'data: {"a":"é\\n","b":[1,null]}\n\n'.encode()


def test_openai_terminator():
    assert sse_event(STREAM_DONE) == b"data: [DONE]\n\n"


def test_native_event_with_id_and_type():
    assert sse_event({"text": "x"}, event="delta", id="1-0") == \
        b'id: 1-0\nevent: delta\ndata: {"text":"x"}\n\n'


def test_raw_text_over_several_lines():
    assert sse_event("a\nb") == b"data: a\ndata: b\n\n"


def test_error_event_parses_back():
    # mid-stream failures go out as an SSE event the openai client raises on
    event = sse_event(error_body("engine died", type="server_error", param=None, code="engine_error"))
    assert json.loads(event.decode().removeprefix("data: "))["error"]["code"] == "engine_error"
