"""The batch workload's offline half: a batch of completion lines sent through the API's Batch
API (`/v1/files`, `/v1/batches`) while the interactive load runs, and its progress followed.

What it measures (issue 34): the interactive short P99 with and without the batch, and the
batch's output tokens/s as a share of the capacity the interactive load leaves idle, where

* the capacity is the output tokens/s of the batch lane's workers with a batch alone on them
  (measured in the same run, all their slots full of lines), and
* what the interactive load leaves idle is that capacity times the share of those workers'
  slot-time the `mixed` phase left free for the batch lane (`idle_slot_share`): nothing while
  one of their interactive lanes (`long`) has a job queued (the batch lane is served only while
  they have none), else their slots not running an interactive job. Slot-time is valued at the
  batch's own rate per slot with all slots full. Both approximations err toward a higher share:
  a long job on the batch lane's engine counts as taking one of its slots, and on a CPU host
  a step's cost grows with its batch, so a line in a small batch runs faster than the full-batch
  rate per slot (on a GPU, the second is small).

Lines are completions with `ignore_eos`, so each line done is exactly its `max_tokens` of
output. `batch_file`, `lines_per_s`, `idle_slot_share` and `figures` are pure; `BatchRun`
talks to the API.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tailguard.bench.loadgen import Client, Sample

#: Statuses a batch does not leave.
TERMINAL = ("completed", "failed", "expired", "cancelled")
#: How often the follower reads the batch (s): fine enough for windows of tens of seconds.
POLL_S = 0.5


def batch_file(lines: int, prompt: str, max_tokens: int, model: str) -> bytes:
    """A JSONL Batch API input of `lines` completion requests, each exactly `max_tokens` out."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    return b"".join(json.dumps({"custom_id": f"line-{i}", "method": "POST",
                                "url": "/v1/completions", "body": body}).encode() + b"\n"
                    for i in range(lines))


@dataclass
class Progress:
    """Lines done over time: (perf_counter, completed) as read from the API."""

    points: list[tuple[float, int]] = field(default_factory=list)
    status: str = "validating"


def completed_at(progress: Progress, t: float) -> float | None:
    """Lines completed at time `t`, interpolated between the two reads around it (None when
    `t` is outside what was read; after the last read of a batch that ended, its count)."""
    pts = progress.points
    if pts and t > pts[-1][0] and progress.status in TERMINAL:
        return float(pts[-1][1])
    if not pts or t < pts[0][0] or t > pts[-1][0]:
        return None
    for (t0, c0), (t1, c1) in zip(pts, pts[1:]):
        if t0 <= t <= t1:
            return c0 if t1 == t0 else c0 + (c1 - c0) * (t - t0) / (t1 - t0)
    return float(pts[-1][1])


def lines_per_s(progress: Progress, start: float, end: float) -> float | None:
    """Lines completed per second within [start, end] (None when either end was not read)."""
    a, b = completed_at(progress, start), completed_at(progress, end)
    return None if a is None or b is None or end <= start else (b - a) / (end - start)


def idle_slot_share(samples: Iterable[Sample], lanes: Iterable[str], slots: int,
                    start_s: float, end_s: float) -> float:
    """The share of `slots` x [start_s, end_s] (phase seconds) that the requests of `lanes` left
    to the batch lane: at each instant none while one of them is queued, else the slots that
    none of them runs. Each request is queued from its submission to its start on a worker
    (`queued_s`), then runs until its last token."""
    wanted = set(lanes)
    events: list[tuple[float, int, int]] = []  # (time, change in queued, change in running)
    for s in samples:
        if s.lane not in wanted or s.sent_s is None or s.e2e_s is None:
            continue
        queued_at = s.sent_s + (s.submit_delay_s or 0.0)
        started_at = queued_at + (s.queued_s or 0.0)
        events += [(queued_at, 1, 0), (started_at, -1, 1), (s.sent_s + s.e2e_s, 0, -1)]
    if end_s <= start_s or slots < 1:
        return 0.0
    idle, queued, running, t = 0.0, 0, 0, start_s
    for when, dq, dr in sorted(events) + [(end_s, 0, 0)]:
        now = min(max(when, start_s), end_s)
        if now > t and queued == 0:
            idle += (now - t) * max(0, slots - running) / slots
        t = max(t, now)
        queued, running = queued + dq, running + dr
    return idle / (end_s - start_s)


def figures(*, short_p99_alone: float | None, short_p99_with: float | None,
            capacity_tok_s: float | None, idle: float, with_load_tok_s: float | None,
            lines: int, tokens_per_line: int) -> dict[str, Any]:
    """The batch workload's report figures (the ratios None where a figure is missing)."""
    idle_tok_s = None if capacity_tok_s is None else capacity_tok_s * idle
    return {
        "short_p99_without_batch_s": short_p99_alone, "short_p99_with_batch_s": short_p99_with,
        "short_p99_ratio": (None if not short_p99_alone or short_p99_with is None
                            else short_p99_with / short_p99_alone),
        "capacity_tok_s": capacity_tok_s, "idle_slot_share": idle,
        "idle_capacity_tok_s": idle_tok_s,
        "batch_tok_s": with_load_tok_s,
        "share_of_idle": (None if not idle_tok_s or with_load_tok_s is None
                          else with_load_tok_s / idle_tok_s),
        "lines": lines, "tokens_per_line": tokens_per_line}


class BatchRun:
    """One batch on the API at `client`: uploaded, created and followed by a thread of its own
    (POLL_S) until it ends or `stop`; `cancel` asks it to stop and waits for its end."""

    def __init__(self, client: Client, data: bytes) -> None:
        self._client = client
        self.progress = Progress()
        file_id = self._upload(data)
        status, body = self._post_json("/v1/batches", {
            "input_file_id": file_id, "endpoint": "/v1/completions",
            "completion_window": "24h", "metadata": {"source": "tailguard bench"}})
        if status != 200:
            raise RuntimeError(f"POST /v1/batches: HTTP {status}: {body}")
        self.batch_id: str = body["id"]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="bench-batch-follower",
                                        daemon=True)
        self._thread.start()

    def _upload(self, data: bytes) -> str:
        boundary = uuid.uuid4().hex
        body = (f"--{boundary}\r\ncontent-disposition: form-data; name=\"purpose\"\r\n\r\n"
                f"batch\r\n--{boundary}\r\ncontent-disposition: form-data; name=\"file\"; "
                f"filename=\"bench.jsonl\"\r\ncontent-type: application/jsonl\r\n\r\n"
                ).encode() + data + f"\r\n--{boundary}--\r\n".encode()
        status, reply = self._client.request_json(
            "POST", "/v1/files", body, f"multipart/form-data; boundary={boundary}", timeout=60)
        if status != 200:
            raise RuntimeError(f"POST /v1/files: HTTP {status}: {reply}")
        return reply["id"]

    def _post_json(self, path: str, payload: dict[str, Any]) -> tuple[int, Any]:
        return self._client.request_json("POST", path, json.dumps(payload).encode(),
                                         "application/json", timeout=60)

    def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                status, body = self._client.get_json(f"/v1/batches/{self.batch_id}")
            except (OSError, http.client.HTTPException):
                status, body = 0, None
            if status == 200 and isinstance(body, dict):
                counts = body.get("request_counts") or {}
                self.progress.points.append((time.perf_counter(),
                                             int(counts.get("completed", 0))))
                self.progress.status = body["status"]
                if body["status"] in TERMINAL:
                    return
            self._stop.wait(POLL_S)

    def wait(self, predicate: Any, timeout_s: float, what: str) -> None:
        """Until `predicate(progress)` holds; RuntimeError after `timeout_s` or at an end that
        does not satisfy it."""
        deadline = time.monotonic() + timeout_s
        while not predicate(self.progress):
            if not self._thread.is_alive():
                raise RuntimeError(f"batch {self.batch_id} ended {self.progress.status} "
                                   f"before {what}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"batch {self.batch_id}: no {what} in {timeout_s:g} s "
                                   f"({self.progress.status})")
            time.sleep(0.1)

    def cancel(self, timeout_s: float = 600.0) -> None:
        """Cancel (running lines finish, as the API's cancel does) and wait for its end."""
        if self.progress.status not in TERMINAL:
            status, body = self._post_json(f"/v1/batches/{self.batch_id}/cancel", {})
            if status != 200 and self.progress.status not in TERMINAL:
                raise RuntimeError(f"cancel {self.batch_id}: HTTP {status}: {body}")
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._stop.set()
            raise RuntimeError(f"batch {self.batch_id} not ended {timeout_s:g} s after its cancel")


__all__ = ["BatchRun", "Progress", "batch_file", "completed_at", "figures", "idle_slot_share",
           "lines_per_s"]
