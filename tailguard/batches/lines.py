"""A batch's input and output lines, as OpenAI documents them; pure, no I/O.

Input: one JSON object a line, ``{"custom_id", "method": "POST", "url", "body"}``. What makes
the whole file unusable (not JSONL, a duplicate custom_id, a url other than the batch's
endpoint, over the limits) fails the batch at ``validating`` with OpenAI's ``errors`` object;
a body the render layer refuses is that line's error-file line, found when it is queued.
Output: ``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}``.
"""

from __future__ import annotations

import array
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from tailguard.gateway.openai_request import Endpoint

#: the batch endpoints served, and the request kind each is on the submit path
ENDPOINTS: dict[str, Endpoint] = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}
#: the completion windows accepted (OpenAI's one), in seconds
COMPLETION_WINDOWS = {"24h": 24 * 3600}
#: errors reported per failed batch at most: a file of 50,000 bad lines needs not say each
MAX_REPORTED_ERRORS = 100


@dataclass(frozen=True)
class LineError:
    """One entry of a failed batch's ``errors.data`` (OpenAI's BatchError)."""

    code: str
    message: str
    line: int | None = None  # 1-based, as OpenAI counts
    param: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}


@dataclass(frozen=True)
class InputLine:
    custom_id: str
    body: dict[str, Any]


@dataclass(frozen=True)
class LineIndex:
    """A validated input file as a running batch's feeder keeps it: each line's custom_id and
    where its bytes lie in the file (start, end), not its body; a body is read from the file
    when its line is queued. Bodies as Python objects take about 3x the file's bytes, and the
    feeder keeps every running batch's input."""

    custom_ids: list[str]
    spans: array.array  # start and end of each line in turn

    def __len__(self) -> int:
        return len(self.custom_ids)

    def span(self, index: int) -> tuple[int, int]:
        return self.spans[2 * index], self.spans[2 * index + 1]


def parse_input(data: bytes, endpoint: str, *, max_lines: int,
                max_bytes: int) -> tuple[list[InputLine], list[LineError]]:
    """The lines of an input file, or the errors that fail its batch (at most
    MAX_REPORTED_ERRORS; any error means no line runs)."""
    index, errors = index_input(data, endpoint, max_lines=max_lines, max_bytes=max_bytes)
    if errors:
        return [], errors
    return [InputLine(custom_id, line_body(data[slice(*index.span(i))]))
            for i, custom_id in enumerate(index.custom_ids)], []


def index_input(data: bytes, endpoint: str, *, max_lines: int,
                max_bytes: int) -> tuple[LineIndex, list[LineError]]:
    """`parse_input`'s checks, keeping each line's custom_id and span only."""
    index = LineIndex([], array.array("q"))
    if len(data) > max_bytes:
        return index, [LineError("too_large", f"the input file has {len(data)} bytes, more than "
                                 f"the {max_bytes} a batch takes (TAILGUARD_BATCH_MAX_FILE_BYTES)")]
    spans = _spans(data)
    if not spans:
        return index, [LineError("empty_file", "the input file has no request lines")]
    if len(spans) > max_lines:
        return index, [LineError("too_many_requests", f"the input file has {len(spans)} "
                                 f"requests, more than the {max_lines} a batch takes "
                                 "(TAILGUARD_BATCH_MAX_LINES)")]
    errors: list[LineError] = []
    seen: set[str] = set()
    for number, (start, end) in enumerate(spans, start=1):
        line, error = _parse_line(data[start:end], number, endpoint, seen)
        if error is not None:
            errors.append(error)
            if len(errors) >= MAX_REPORTED_ERRORS:
                break
        elif line is not None and not errors:
            index.custom_ids.append(line.custom_id)
            index.spans.extend((start, end))
    return (LineIndex([], array.array("q")), errors) if errors else (index, [])


def line_body(raw: bytes) -> dict[str, Any]:
    """The body of one input line that validated (its bytes, as LineIndex spans them)."""
    return json.loads(raw)["body"]


def _spans(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of each line of `data` that is not blank."""
    spans, start = [], 0
    while start < len(data):
        end = data.find(b"\n", start)
        end = len(data) if end < 0 else end
        if data[start:end].strip():
            spans.append((start, end))
        start = end + 1
    return spans


def _parse_line(raw: bytes, number: int, endpoint: str,
                seen: set[str]) -> tuple[InputLine | None, LineError | None]:
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None, LineError("invalid_json_line", "this line is not valid JSON", number)
    if not isinstance(obj, dict):
        return None, LineError("invalid_request", "each line must be a JSON object", number)
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return None, LineError("missing_required_parameter", "custom_id must be a non-empty "
                               "string", number, "custom_id")
    if custom_id in seen:
        return None, LineError("duplicate_custom_id", f"the custom_id {custom_id!r} is used by "
                               "an earlier line; each must be unique", number, "custom_id")
    seen.add(custom_id)
    if obj.get("method") != "POST":
        return None, LineError("invalid_method", "method must be POST", number, "method")
    if obj.get("url") != endpoint:
        return None, LineError("mismatched_endpoint", f"url must be the batch's endpoint "
                               f"{endpoint}, got {obj.get('url')!r}", number, "url")
    if not isinstance(obj.get("body"), dict):
        return None, LineError("invalid_request", "body must be a JSON object", number, "body")
    return InputLine(custom_id, obj["body"]), None


def line_job_id(batch_id: str, index: int, attempt: int = 0) -> str:
    """The job id of a line's attempt: the same whoever queues it, so a feeder that queues a
    line again after a restart finds the job it queued before instead of running it twice."""
    return hashlib.sha256(f"{batch_id}:{index}:{attempt}".encode()).hexdigest()[:32]


def output_line(custom_id: str, job_id: str, status_code: int, body: Any) -> dict[str, Any]:
    """A line that got an HTTP answer: the body the synchronous endpoint would have sent
    (vLLM's response, or OpenAI's error shape for a refusal)."""
    return {"id": f"batch_req_{job_id}", "custom_id": custom_id,
            "response": {"status_code": status_code, "request_id": job_id, "body": body},
            "error": None}


def error_line(custom_id: str, job_id: str | None, code: str, message: str) -> dict[str, Any]:
    """A line that got no HTTP answer (batch_expired, batch_cancelled, ...)."""
    return {"id": f"batch_req_{job_id or '0' * 32}", "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": message}}


EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."
CANCELLED_MESSAGE = "This request was not executed: the batch was cancelled."


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    """Lines as a JSONL file's bytes."""
    return b"".join(json.dumps(ln, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
                    for ln in lines)
