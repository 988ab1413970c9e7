"""Files and batches as OpenAI shapes them, from their Redis records; pure, no I/O."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

VALIDATING, IN_PROGRESS, FINALIZING, COMPLETED = "validating", "in_progress", "finalizing", "completed"
FAILED, EXPIRED, CANCELLING, CANCELLED = "failed", "expired", "cancelling", "cancelled"
#: a batch in one of these has ended: its files are written, the feeder leaves it
ENDED = frozenset({COMPLETED, FAILED, EXPIRED, CANCELLED})
#: the purposes a file may have: what a client uploads, what a batch writes
PURPOSE_INPUT, PURPOSE_OUTPUT = "batch", "batch_output"

#: a batch record's fields that are Unix seconds (OpenAI's timestamps are integers)
TIMESTAMPS = ("created_at", "in_progress_at", "expires_at", "finalizing_at", "completed_at",
              "failed_at", "expired_at", "cancelling_at", "cancelled_at")
#: the fields OpenAI's batch object has that a record keeps as text
_TEXT_FIELDS = ("id", "endpoint", "input_file_id", "completion_window", "status",
                "output_file_id", "error_file_id", "model")
_JSON_FIELDS = ("metadata", "errors")
#: metadata as OpenAI bounds it
MAX_METADATA_KEYS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512


def new_file_id() -> str:
    return "file-" + uuid.uuid4().hex


def new_batch_id() -> str:
    return "batch_" + uuid.uuid4().hex


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def decode(raw: Mapping[bytes | str, bytes | str]) -> dict[str, Any]:
    """A Redis hash of a file or batch as typed values."""
    out: dict[str, Any] = {}
    for k, v in raw.items():
        key, value = _text(k), _text(v)
        if key in _JSON_FIELDS:
            out[key] = json.loads(value)
        elif key in TIMESTAMPS or key in ("bytes", "total", "next"):
            out[key] = int(float(value))
        else:
            out[key] = value
    return out


def encode(fields: Mapping[str, Any]) -> dict[str, str]:
    """Fields as the strings a Redis hash stores (None: not stored)."""
    return {k: json.dumps(v) if k in _JSON_FIELDS else str(v)
            for k, v in fields.items() if v is not None}


def file_object(record: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI's File object."""
    return {"id": record["id"], "object": "file", "bytes": record["bytes"],
            "created_at": record["created_at"], "filename": record["filename"],
            "purpose": record["purpose"], "status": "processed",
            "expires_at": record.get("expires_at"), "status_details": None}


def batch_object(record: Mapping[str, Any], completed: int, failed: int) -> dict[str, Any]:
    """OpenAI's Batch object; `completed` and `failed`: its lines that ended so far."""
    out: dict[str, Any] = {"id": record["id"], "object": "batch"}
    for name in _TEXT_FIELDS[1:]:
        out[name] = record.get(name)
    for name in TIMESTAMPS:
        out[name] = record.get(name)
    out["metadata"] = record.get("metadata")
    out["errors"] = record.get("errors")
    out["request_counts"] = {"total": record.get("total", 0), "completed": completed,
                             "failed": failed}
    return out


def check_metadata(metadata: Any) -> str | None:
    """Why `metadata` is not OpenAI's (at most 16 string pairs, keys 64 and values 512
    characters at most); None when it is."""
    if metadata is None:
        return None
    if not isinstance(metadata, dict) or len(metadata) > MAX_METADATA_KEYS:
        return f"metadata must be an object of at most {MAX_METADATA_KEYS} pairs"
    for k, v in metadata.items():
        if not isinstance(v, str) or len(k) > MAX_METADATA_KEY or len(v) > MAX_METADATA_VALUE:
            return (f"metadata keys must be at most {MAX_METADATA_KEY} characters and values "
                    f"strings of at most {MAX_METADATA_VALUE}")
    return None


def page(objects: Sequence[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """A cursor page as OpenAI lists (``after`` = the last id of the page before)."""
    return {"object": "list", "data": list(objects),
            "first_id": objects[0]["id"] if objects else None,
            "last_id": objects[-1]["id"] if objects else None, "has_more": has_more}
