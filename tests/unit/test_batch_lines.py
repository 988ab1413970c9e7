"""The Batch API's pure parts: an input file's validation, the line formats, and the objects as
the official openai SDK's own types parse them (tailguard/batches/lines.py, objects.py)."""

from __future__ import annotations

import json

import pytest
from openai.types import Batch, FileObject

from tailguard.batches.lines import (
    MAX_REPORTED_ERRORS,
    error_line,
    index_input,
    jsonl,
    line_body,
    line_job_id,
    output_line,
    parse_input,
)
from tailguard.batches.objects import (
    COMPLETED,
    batch_object,
    check_metadata,
    decode,
    encode,
    file_object,
    new_batch_id,
    new_file_id,
    page,
)
from tailguard.redis.keys import is_batch_id, is_file_id, is_job_id

CHAT = "/v1/chat/completions"


def line(custom_id="a", url=CHAT, method="POST", body=None) -> dict:
    return {"custom_id": custom_id, "method": method, "url": url,
            "body": body if body is not None else {"model": "m", "messages": []}}


def parse(*lines, raw: bytes | None = None, max_lines=50_000, max_bytes=200 << 20):
    data = raw if raw is not None else jsonl(list(lines))
    return parse_input(data, CHAT, max_lines=max_lines, max_bytes=max_bytes)


def test_a_good_file_gives_its_lines_in_order():
    lines, errors = parse(line("x"), line("y"), line("z"))
    assert errors == [] and [ln.custom_id for ln in lines] == ["x", "y", "z"]
    assert lines[0].body == {"model": "m", "messages": []}


def test_a_running_batchs_index_keeps_custom_ids_and_spans_not_bodies():
    """What the feeder keeps of each running batch's input: a small part of the file (parsed
    bodies take about 3x its bytes); a line's body is read back from its span."""
    import tracemalloc

    body = {"model": "m", "messages": [{"role": "user", "content": "x " * 500}], "max_tokens": 8}
    data = b"\n" + jsonl([line(f"req-{i}", body=body) for i in range(5000)])
    tracemalloc.start()
    try:
        index, errors = index_input(data, CHAT, max_lines=50_000, max_bytes=200 << 20)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not errors and len(index) == 5000 and index.custom_ids[4999] == "req-4999"
    assert held < len(data) / 10, (held, len(data))
    assert line_body(data[slice(*index.span(7))]) == body


def test_blank_lines_and_a_missing_final_newline_are_fine():
    raw = b"\n" + jsonl([line("x")]) + b"\n\n" + json.dumps(line("y")).encode()
    lines, errors = parse(raw=raw)
    assert not errors and len(lines) == 2


@pytest.mark.parametrize("raw, code, number, param", [
    (b"not json\n", "invalid_json_line", 1, None),
    (b"[1, 2]\n", "invalid_request", 1, None),
    (jsonl([line("a"), line("a")]), "duplicate_custom_id", 2, "custom_id"),
    (jsonl([line(url="/v1/completions")]), "mismatched_endpoint", 1, "url"),
    (jsonl([line(method="GET")]), "invalid_method", 1, "method"),
    (jsonl([{"method": "POST", "url": CHAT, "body": {}}]), "missing_required_parameter", 1,
     "custom_id"),
    (jsonl([line(body=[])]), "invalid_request", 1, "body"),
])
def test_a_malformed_file_fails_with_openais_errors(raw, code, number, param):
    lines, errors = parse(raw=raw)
    assert lines == []
    [error] = [e for e in errors if e.code == code]
    assert error.line == number and error.param == param
    assert set(error.to_dict()) == {"code", "message", "param", "line"}


def test_the_limits_fail_the_file_as_a_whole():
    assert parse(line("a"), line("b"), max_lines=1)[1][0].code == "too_many_requests"
    assert parse(line("a"), max_bytes=10)[1][0].code == "too_large"
    assert parse(raw=b"\n \n")[1][0].code == "empty_file"


def test_at_most_so_many_errors_are_reported():
    _, errors = parse(raw=b"x\n" * (MAX_REPORTED_ERRORS + 50))
    assert len(errors) == MAX_REPORTED_ERRORS


def test_a_lines_job_id_is_deterministic_and_a_job_id():
    batch = new_batch_id()
    assert line_job_id(batch, 3) == line_job_id(batch, 3)
    assert len({line_job_id(batch, i, a) for i in range(50) for a in range(3)}) == 150
    assert is_job_id(line_job_id(batch, 0)) and is_batch_id(batch) and is_file_id(new_file_id())


def test_output_and_error_lines_have_openais_shape():
    ok = output_line("c1", "ab" * 16, 200, {"id": "chatcmpl-1"})
    assert ok == {"id": "batch_req_" + "ab" * 16, "custom_id": "c1", "error": None,
                  "response": {"status_code": 200, "request_id": "ab" * 16,
                               "body": {"id": "chatcmpl-1"}}}
    expired = error_line("c2", None, "batch_expired", "late")
    assert expired["response"] is None and expired["error"] == {"code": "batch_expired",
                                                                "message": "late"}
    assert jsonl([ok, expired]).count(b"\n") == 2


def test_the_objects_parse_with_the_sdks_types():
    record = {"id": new_file_id(), "bytes": 12, "created_at": 1700000000, "filename": "in.jsonl",
              "purpose": "batch", "owner": ""}
    f = FileObject.model_validate(file_object(decode(encode(record))))
    assert f.purpose == "batch" and f.bytes == 12 and f.expires_at is None
    batch = {"id": new_batch_id(), "endpoint": CHAT, "input_file_id": record["id"],
             "completion_window": "24h", "status": COMPLETED, "created_at": 1700000000,
             "expires_at": 1700086400, "completed_at": 1700000100, "total": 3,
             "metadata": {"k": "v"}, "output_file_id": new_file_id(),
             "errors": {"object": "list", "data": []}}
    b = Batch.model_validate(batch_object(decode(encode(batch)), 2, 1))
    assert b.status == "completed" and b.request_counts.total == 3
    assert b.request_counts.completed == 2 and b.request_counts.failed == 1
    assert b.metadata == {"k": "v"} and b.completed_at == 1700000100 and b.failed_at is None


def test_a_page_names_its_ends():
    assert page([{"id": "a"}, {"id": "b"}], True) == {
        "object": "list", "data": [{"id": "a"}, {"id": "b"}], "first_id": "a", "last_id": "b",
        "has_more": True}
    assert page([], False)["first_id"] is None


@pytest.mark.parametrize("metadata, ok", [
    (None, True), ({"a": "b"}, True), ({str(i): "v" for i in range(17)}, False),
    ({"a": 1}, False), ({"a" * 65: "v"}, False), ("x", False)])
def test_metadata_is_bounded_as_openais(metadata, ok):
    assert (check_metadata(metadata) is None) == ok
