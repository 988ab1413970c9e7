"""The text a job record keeps of an OpenAI job (tailguard.jobs.stream.choice0_text): choice 0's of
a chat or a completion, and a Responses API job's output text, from its response or its events."""

import json

from tailguard.jobs.stream import choice0_text


def test_a_chats_response_and_chunks():
    response = {"choices": [{"index": 1, "message": {"content": "no"}},
                            {"index": 0, "message": {"content": "yes"}}]}
    assert choice0_text([], json.dumps(response)) == "yes"
    chunks = [{"choices": [{"index": 0, "delta": {"content": "ye"}}]},
              {"choices": [{"index": 1, "delta": {"content": "n"}}]},
              {"choices": [{"index": 0, "text": "s"}]}]
    assert choice0_text([json.dumps(c) for c in chunks]) == "yes"


def test_a_responses_api_response_and_events():
    response = {"object": "response", "output": [
        {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "hmm"}]},
        {"type": "message", "content": [{"type": "output_text", "text": "Hel"},
                                        {"type": "output_text", "text": "lo"}]}]}
    assert choice0_text([], json.dumps(response)) == "Hello"
    events = [{"type": "response.created", "response": {"output": []}},
              {"type": "response.output_text.delta", "delta": "Hel"},
              {"type": "response.reasoning_text.delta", "delta": "hmm"},
              {"type": "response.output_text.delta", "delta": "lo"}]
    assert choice0_text([json.dumps(e) for e in events]) == "Hello"
