"""The Batch API with the official `openai` SDK, through the API (gunicorn, its batch feeder
thread) to the session's real workers and engines on the batch lane (tests/e2e_fixtures.py):
upload, create, poll, download; each output line's body parsed by the SDK's own types. Another
key's 404s and the feeder's restart and expiry are checked without an engine:
tests/integration/test_batches_on_redis.py."""

from __future__ import annotations

import io
import json
import time

import openai
import pytest
import requests
from e2e_support import wait_openai_ready
from openai.types import Completion
from openai.types.chat import ChatCompletion

pytestmark = pytest.mark.e2e

MODEL = "tailguard-demo"
LINES = 200
POLL_S = 1.0
BATCH_TIMEOUT_S = 900


@pytest.fixture(scope="module")
def api(api_url):
    return wait_openai_ready(api_url)


@pytest.fixture(scope="module")
def client(api):
    """The official client; the files this module made are deleted after it (the session's API
    keeps them under its state directory)."""
    client = openai.OpenAI(base_url=api + "/v1", api_key="unused", max_retries=0, timeout=120)
    before = {f.id for f in client.files.list()}
    yield client
    for f in client.files.list():
        if f.id not in before:
            client.files.delete(f.id)


def request_line(i: int, url: str, body: dict) -> dict:
    return {"custom_id": f"req-{i}", "method": "POST", "url": url, "body": body}


def chat_body(i: int) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": f"count to {i}"}],
            "max_tokens": 3, "ignore_eos": True}


def completion_body(i: int) -> dict:
    return {"model": MODEL, "prompt": f"line {i}:", "max_tokens": 3, "ignore_eos": True}


def upload(client, lines: list[dict]):
    data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    return client.files.create(file=("input.jsonl", io.BytesIO(data)), purpose="batch")


def wait_ended(client, batch_id: str, workers):
    deadline = time.monotonic() + BATCH_TIMEOUT_S
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        workers.check()
        time.sleep(POLL_S)
    raise AssertionError(f"batch {batch_id} still {batch.status} after {BATCH_TIMEOUT_S} s "
                         f"({batch.request_counts})")


def lines_of(client, file_id: str) -> list[dict]:
    return [json.loads(ln) for ln in client.files.content(file_id).text.splitlines()]


@pytest.mark.parametrize("url, body, parse", [
    ("/v1/chat/completions", chat_body, ChatCompletion.model_validate),
    ("/v1/completions", completion_body, Completion.model_validate),
], ids=["chat", "completion"])
def test_a_batch_of_200_lines_completes_with_one_line_each(client, workers, url, body, parse):
    bad = 17
    lines = [request_line(i, url, body(i)) for i in range(LINES)]
    lines[bad]["body"]["max_tokens"] = -1  # vLLM's request model refuses it: an error-file line
    source = upload(client, lines)
    assert source.purpose == "batch" and source.bytes > 0
    batch = client.batches.create(input_file_id=source.id, endpoint=url, completion_window="24h",
                                  metadata={"test": "e2e"})
    assert batch.status == "validating" and batch.metadata == {"test": "e2e"}
    done = wait_ended(client, batch.id, workers)
    assert done.status == "completed", done
    assert done.request_counts.total == LINES and done.request_counts.completed == LINES - 1
    assert done.request_counts.failed == 1
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    out = lines_of(client, done.output_file_id)
    assert [x["custom_id"] for x in out] == [f"req-{i}" for i in range(LINES) if i != bad]
    for x in out:
        assert x["error"] is None and x["response"]["status_code"] == 200
        answer = parse(x["response"]["body"])
        assert answer.model == MODEL and answer.usage.completion_tokens == 3
        assert answer.model_extra["tailguard"]["lane"] == "batch"
    [err] = lines_of(client, done.error_file_id)
    assert err["custom_id"] == f"req-{bad}" and err["response"]["status_code"] == 400
    assert err["response"]["body"]["error"]["type"] == "invalid_request_error"
    assert client.files.retrieve(done.output_file_id).purpose == "batch_output"
    assert batch.id in {b.id for b in client.batches.list(limit=100)}


def test_a_malformed_file_fails_at_validating(client, workers):
    lines = [request_line(i, "/v1/chat/completions", chat_body(i)) for i in range(3)]
    lines.append(lines[0])  # a duplicate custom_id
    lines.append(request_line(9, "/v1/completions", completion_body(9)))  # another endpoint
    batch = client.batches.create(input_file_id=upload(client, lines).id,
                                  endpoint="/v1/chat/completions", completion_window="24h")
    done = wait_ended(client, batch.id, workers)
    assert done.status == "failed" and done.failed_at and done.output_file_id is None
    assert {(e.code, e.line) for e in done.errors.data} == {("duplicate_custom_id", 4),
                                                            ("mismatched_endpoint", 5)}


def test_cancel_mid_batch_ends_cancelled_with_partial_output(client, workers, api):
    lines = [request_line(i, "/v1/completions", completion_body(i)) for i in range(LINES)]
    batch = client.batches.create(input_file_id=upload(client, lines).id,
                                  endpoint="/v1/completions", completion_window="24h")
    deadline = time.monotonic() + 120
    while client.batches.retrieve(batch.id).status == "validating" and time.monotonic() < deadline:
        time.sleep(0.2)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = wait_ended(client, batch.id, workers)
    assert done.status == "cancelled" and done.cancelled_at
    out = lines_of(client, done.output_file_id) if done.output_file_id else []
    errors = lines_of(client, done.error_file_id)
    assert len(out) + len(errors) == LINES and len(out) < LINES
    assert {x["error"]["code"] for x in errors} == {"batch_cancelled"}
    assert len({x["custom_id"] for x in out + errors}) == LINES
    assert requests.get(f"{api}/v1/files/file-{'0' * 32}", timeout=10).status_code == 404
    assert client.files.delete(done.error_file_id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(done.error_file_id)
