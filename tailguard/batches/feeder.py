"""The batch feeder: runs every batch's lines as jobs on the batch lane, a few at a time.

It runs as a thread in each API process (the render layer that validates and costs a line
is there), and one at a time does the work: the one holding ``keys.BATCH_FEEDER_LEASE``.
Each tick it reads, from Redis alone (level-triggered: a feeder killed mid-batch is
replaced within a lease and carries on), every batch not yet ended, in turn from a rotating
start (round-robin), and for each:

- ``validating``: reads its input file (``lines.index_input``: each line's custom_id and
  where it lies in the file are kept, its body read when it is queued): ``failed`` with OpenAI's
  errors, or ``in_progress`` with its line count;
- collects the lines whose jobs ended: an output line, an error line, or (a job that expired
  in its queue or lost its worker: nothing ran to its end) the line queued again, at most
  MAX_ATTEMPTS times;
- ``in_progress``: queues its next lines until TAILGUARD_BATCH_LINES_IN_FLIGHT are queued
  or running, each through the gateway's one submit path as a synchronous OpenAI request is
  (validated and rendered by vLLM, costed, capped, admitted; its cost drawn from the key's
  batch tokens bucket, of its tokens/min, apart from its other requests'), placed as
  ``batch``. A refusal (429: the lane's backlog, the owner's tokens bucket or fair share)
  holds back that batch alone until the next tick, so one tenant's limits never stall
  another's batch; a 503 (no live worker, Redis full) stops the tick's feeding of every
  batch. A body the render layer refuses is the line's error line. Each line's job id is
  deterministic (``lines.line_job_id``) and created only if absent: a line queued twice runs
  once;
- past its completion window: the lines still queued or running are cancelled and written
  as ``batch_expired`` errors, the batch ends ``expired``;
- ``cancelling`` (POST .../cancel): nothing more is queued; once its queued and running lines
  have finished, the rest are ``batch_cancelled`` errors and it ends ``cancelled``;
- once every line ended: ``finalizing``, the output and error files written, ``completed``.

The input is read again (a feeder that took over, or restarted) under the limits it was
validated with, not today's; the API refuses to delete the input of a batch not yet ended.
Input that is gone or changed all the same ends the batch ``failed``, its finished lines
written to its files first. Each batch's step renews the lease and stops the tick once
another process holds it: a long parse cannot leave two feeders writing.
"""

from __future__ import annotations

import array
import dataclasses
import hashlib
import json
import logging
import os
import socket
import threading
from typing import Any

import redis

from tailguard.batches.lines import (
    CANCELLED_MESSAGE,
    ENDPOINTS,
    EXPIRED_MESSAGE,
    InputLine,
    LineIndex,
    error_line,
    index_input,
    jsonl,
    line_body,
    line_job_id,
    output_line,
)
from tailguard.batches.objects import (
    CANCELLED,
    CANCELLING,
    COMPLETED,
    ENDED,
    EXPIRED,
    FAILED,
    FINALIZING,
    IN_PROGRESS,
    PURPOSE_OUTPUT,
    VALIDATING,
)
from tailguard.batches.store import BatchStore
from tailguard.errors import (
    InternalJobError,
    InvalidField,
    JobExpired,
    JobStateConflict,
    MessageLost,
    Refused,
    TailguardError,
    Unauthenticated,
    Unavailable,
    WorkerLost,
)
from tailguard.gateway.api_keys import BATCH_TOKENS, ApiKey
from tailguard.gateway.openai_errors import openai_error
from tailguard.gateway.service import Gateway, job_error, succeeded
from tailguard.jobs.store import TERMINAL
from tailguard.redis import keys
from tailguard.redis.lease import Lease

log = logging.getLogger("tailguard.batches")

#: a line's job that ended without running to its end is queued again, this many times in all
MAX_ATTEMPTS = 3
#: the codes of such an end: nothing of the line's own made it fail
RETRIED = frozenset({JobExpired.code, WorkerLost.code, MessageLost.code})
#: lease periods a holder may miss before another process takes over
LEASE_PERIODS = 10
#: how often expired output files are deleted, in seconds
SWEEP_S = 60
#: a line not queued now: refused for its batch (429), or the lane unavailable to all (503)
HELD, CLOSED = "held", "closed"


def result_file_id(batch_id: str, kind: str) -> str:
    """A batch's output or error file id, the same each time it is written (a finalize that
    runs again rewrites the same file)."""
    return "file-" + hashlib.sha256(f"{batch_id}:{kind}".encode()).hexdigest()[:32]


class BatchFeeder:
    """See the module docstring; `start()`/`close()` own its thread, `tick()` is one pass."""

    def __init__(self, store: BatchStore, gateway: Gateway, *, lines_in_flight: int,
                 period_s: float, max_lines: int, max_file_bytes: int,
                 owner: str | None = None) -> None:
        self.store, self.gateway = store, gateway
        self.lines_in_flight, self.period_s = lines_in_flight, period_s
        self.max_lines, self.max_file_bytes = max_lines, max_file_bytes
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{id(self)}"
        self._lease = Lease(store.redis, keys.BATCH_FEEDER_LEASE)
        self._lines: dict[str, LineIndex] = {}  # batch id -> its input's index, while it runs
        self._turn = 0
        self._next_sweep = 0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="tailguard-batch-feeder", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop its thread and give up the lease, so another process feeds at once."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self._lease.release(self.owner)
        except redis.RedisError:
            pass  # it lapses by itself

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.tick()
            except (redis.RedisError, TailguardError) as exc:
                log.warning("batch feeder tick failed: %s", exc)
            except Exception:
                log.exception("batch feeder tick failed")
            self._stopping.wait(self.period_s)

    def tick(self) -> bool:
        """One pass over the batches if this process holds the lease; whether it does."""
        if not self._hold():
            return False
        now = self.store.now()
        if now >= self._next_sweep:
            self.store.delete_expired_files()
            self._next_sweep = now + SWEEP_S
        active = self.store.active()
        self._turn += 1
        start = self._turn % len(active) if active else 0
        lane_open = True
        for batch_id in active[start:] + active[:start]:
            if not self._hold():
                return False  # another process feeds now (a long parse outlasted the lease)
            try:
                lane_open = self.step(batch_id, now, lane_open)
            except redis.RedisError:
                raise
            except Exception:  # one batch's bug must not hold up the others
                log.exception("batch %s: the feeder's step failed", batch_id)
        return True

    def _hold(self) -> bool:
        """Take or renew the lease; whether this process feeds now."""
        if self._lease.hold(self.owner, max(1.0, LEASE_PERIODS * self.period_s)):
            return True
        self._lines.clear()  # another process feeds: its view, not this cache, is current
        return False

    def step(self, batch_id: str, now: int, lane_open: bool) -> bool:
        """Move one batch on; whether the lane still takes lines this tick."""
        record = self.store.batch(batch_id)
        if record is None or record["status"] in ENDED:
            if record is not None:
                self.store.ended(batch_id, *self.store.counts(batch_id))
            else:
                self.store.redis.srem(keys.BATCHES_ACTIVE, batch_id)
            self._lines.pop(batch_id, None)
            return lane_open
        if record["status"] == VALIDATING:
            self.validate(record)
            record = self.store.batch(batch_id)
            if record is None or record["status"] in ENDED or record["status"] == VALIDATING:
                return lane_open
        lines = self.lines(record)
        if lines is None:
            return lane_open
        self.collect(record, lines)
        if record["status"] == IN_PROGRESS and now >= record["expires_at"]:
            self.expire(record)
        elif record["status"] == IN_PROGRESS:
            if lane_open:
                lane_open = self.feed(record, lines)
            if sum(self.store.counts(batch_id)) >= record["total"]:
                self.store.set_status(batch_id, {IN_PROGRESS}, FINALIZING, {"ending": COMPLETED})
        elif record["status"] == CANCELLING and not self.store.pending(batch_id):
            self.store.set_status(batch_id, {CANCELLING}, FINALIZING, {"ending": CANCELLED})
        record = self.store.batch(batch_id)
        if record is not None and record["status"] == FINALIZING:
            self.finalize(record, lines)
        return lane_open

    # -- validating ------------------------------------------------------------------------

    def validate(self, record: dict[str, Any]) -> None:
        batch_id = record["id"]
        data = self.store.contents.get(record["input_file_id"])
        if data is None:
            lines, errors = None, [{"code": "invalid_file", "message": "the input file is gone",
                                    "param": "input_file_id", "line": None}]
        else:
            lines, found = index_input(data, record["endpoint"], max_lines=self.max_lines,
                                       max_bytes=self.max_file_bytes)
            errors = [e.to_dict() for e in found]
        if not self._hold():
            return  # the parse outlasted the lease: the new holder validates it
        if errors:
            if self.store.set_status(batch_id, {VALIDATING}, FAILED,
                                     {"errors": {"object": "list", "data": errors}}):
                self.store.ended(batch_id, 0, 0)
            return
        if lines is not None and self.store.set_status(batch_id, {VALIDATING}, IN_PROGRESS,
                                                       {"total": len(lines)}):
            self._lines[batch_id] = lines

    def lines(self, record: dict[str, Any]) -> LineIndex | None:
        """The batch's input's index (read again after a restart); None after failing it."""
        batch_id = record["id"]
        if batch_id not in self._lines:
            parsed = self._read_again(record)
            if parsed is None:
                self.fail_unreadable(record)
                return None
            if not self._hold():
                return None  # the parse outlasted the lease: the new holder carries on
            self._lines[batch_id] = parsed
        return self._lines[batch_id]

    def _read_again(self, record: dict[str, Any]) -> LineIndex | None:
        """The input of a batch validated before: its `total` lines, or None when its contents
        are gone or no longer those lines. The limits were checked at validating: lowered
        since, they apply to new batches only."""
        total = record.get("total") or 0
        data = self.store.contents.get(record["input_file_id"]) if total else b""
        if data is None:
            return None
        if not total:
            return LineIndex([], array.array("q"))
        index, errors = index_input(data, record["endpoint"], max_lines=total,
                                    max_bytes=len(data))
        return None if errors or len(index) != total else index

    def fail_unreadable(self, record: dict[str, Any]) -> None:
        """Its input went while it ran: no more lines can be queued or matched to their
        custom_id. The lines in flight are cancelled; the finished ones are written to its
        output and error files (never dropped), and it ends ``failed``."""
        batch_id = record["id"]
        self.store.set_status(batch_id, {IN_PROGRESS, CANCELLING}, FINALIZING, {
            "ending": FAILED, "errors": {"object": "list", "data": [{
                "code": "invalid_file", "param": "input_file_id", "line": None,
                "message": "the input file was deleted or changed while the batch ran; the "
                           "lines that had finished are in its output and error files"}]}})
        for index, attempt in self.store.pending(batch_id).items():
            self.gateway.cancel(line_job_id(batch_id, index, attempt),
                                reason="the batch's input file is gone", missing_ok=True)
        record = self.store.batch(batch_id)
        if record is not None and record["status"] == FINALIZING:
            self.finalize(record, None)

    # -- running ---------------------------------------------------------------------------

    def feed(self, record: dict[str, Any], lines: LineIndex) -> bool:
        """Queue lines until the batch has its most in flight or a line is refused; False
        once the lane is unavailable (503) to every batch."""
        batch_id = record["id"]
        room = self.lines_in_flight - len(self.store.pending(batch_id))
        retries = self.store.retries(batch_id)
        caller = self._caller(record)
        cursor = record.get("next", 0)
        while room > 0:
            if self._stopping.is_set():
                return False  # the API is stopping: the next feeder queues the rest
            if retries:
                index, attempt = retries.pop(0)
                next_index = None
            elif cursor < len(lines):
                index, attempt, next_index = cursor, 0, cursor + 1
            else:
                return True
            body = self._body(record, lines, index)
            if body is None:
                self.fail_unreadable(record)
                return True
            outcome = self._queue(record, index, attempt, InputLine(lines.custom_ids[index], body),
                                  caller)
            if outcome in (HELD, CLOSED):
                return outcome == HELD
            if outcome == "queued":
                self.store.queued(batch_id, index, attempt, next_index)
                room -= 1
            else:
                self.store.finish_line(batch_id, index, outcome, ok=False, next_index=next_index)
            if next_index is not None:
                cursor = next_index
        return True

    def _caller(self, record: dict[str, Any]) -> ApiKey | None | Unauthenticated:
        owner = record.get("owner") or ""
        if not owner:
            return None
        key = self.gateway.api_keys.by_id(owner)
        return key if key is not None else Unauthenticated(
            "the API key that created this batch was revoked")

    def _body(self, record: dict[str, Any], lines: LineIndex, index: int) -> dict[str, Any] | None:
        """Line `index`'s body, read from the input file; None when the file is gone."""
        raw = self.store.contents.read_range(record["input_file_id"], *lines.span(index))
        try:
            return None if raw is None else line_body(raw)
        except (ValueError, KeyError, TypeError):
            return None  # the file changed under the batch

    def _queue(self, record: dict[str, Any], index: int, attempt: int, line: InputLine,
               caller: ApiKey | None | Unauthenticated) -> str:
        """Queue one line's attempt: "queued", its error line (a line the synchronous
        endpoint would have refused), HELD when it is refused now (429: this batch waits for
        the next tick) or CLOSED when the lane is unavailable (503: every batch waits)."""
        job_id = line_job_id(record["id"], index, attempt)
        if self.store.redis.exists(keys.job_key(job_id)):
            return "queued"
        try:
            if isinstance(caller, Unauthenticated):
                raise caller
            job = self.gateway.prepare_openai(ENDPOINTS[record["endpoint"]], line.body)
            if job.stream:
                raise InvalidField("stream is not served in a batch", field="stream")
            self.gateway.submit(dataclasses.replace(job, priority="batch"), caller, job_id=job_id,
                                token_bucket=BATCH_TOKENS)
        except Refused:
            return HELD
        except Unavailable:
            return CLOSED
        except JobStateConflict:
            return "queued"
        except TailguardError as exc:
            return _dumps(output_line(line.custom_id, job_id, exc.http_status, openai_error(exc)))
        return "queued"

    def collect(self, record: dict[str, Any], lines: LineIndex) -> None:
        """Write the line of every line whose job ended (or queue it again)."""
        batch_id = record["id"]
        for index, attempt in self.store.pending(batch_id).items():
            job_id = line_job_id(batch_id, index, attempt)
            job = self.gateway.store.settle(job_id)
            custom_id = lines.custom_ids[index]
            if job is None:
                err: TailguardError = InternalJobError(f"the record of job {job_id} expired "
                                                       "before its line was collected")
                line = output_line(custom_id, job_id, err.http_status, openai_error(err))
                self.store.finish_line(batch_id, index, _dumps(line), ok=False)
                continue
            if job["status"] not in TERMINAL:
                continue
            if succeeded(job) and (body := self.gateway.response_body(job_id)) is not None:
                line = output_line(custom_id, job_id, 200, json.loads(body))
                self.store.finish_line(batch_id, index, _dumps(line), ok=True)
                continue
            err = job_error(job) if not succeeded(job) else InternalJobError(
                f"job {job_id} succeeded without a response in its stream")
            if err.code in RETRIED and attempt + 1 < MAX_ATTEMPTS and record["status"] == IN_PROGRESS:
                self.store.retry(batch_id, index, attempt + 1)
                continue
            line = output_line(custom_id, job_id, err.http_status, openai_error(err))
            self.store.finish_line(batch_id, index, _dumps(line), ok=False)

    def expire(self, record: dict[str, Any]) -> None:
        """Past the completion window: the lines still in flight are cancelled (their lines are
        written as batch_expired when the batch's files are), and it finalizes as expired."""
        batch_id = record["id"]
        if not self.store.set_status(batch_id, {IN_PROGRESS}, FINALIZING, {"ending": EXPIRED}):
            return
        for index, attempt in self.store.pending(batch_id).items():
            self.gateway.cancel(line_job_id(batch_id, index, attempt),
                                reason="the batch's completion window expired", missing_ok=True)

    # -- finalizing ------------------------------------------------------------------------

    def finalize(self, record: dict[str, Any], lines: LineIndex | None) -> None:
        """Write the output and error files (one line per input line between them, in input
        order; the finished lines alone when its input is gone, `lines` None), then end the
        batch as its `ending` says."""
        batch_id, ending = record["id"], record.get("ending", COMPLETED)
        outputs = self.store.finished_lines(batch_id, "output")
        errors = self.store.finished_lines(batch_id, "errors")
        code, message = (("batch_expired", EXPIRED_MESSAGE) if ending == EXPIRED
                         else ("batch_cancelled", CANCELLED_MESSAGE))
        for index, custom_id in enumerate(lines.custom_ids if lines is not None else ()):
            if index not in outputs and index not in errors:
                errors[index] = _dumps(error_line(custom_id, None, code, message))
        fields: dict[str, Any] = {}
        expires_at = self.store.now() + self.store.output_ttl_s
        for kind, found in (("output", outputs), ("error", errors)):
            if not found:
                continue
            file_id = result_file_id(batch_id, kind)
            data = b"".join(found[i].encode() + b"\n" for i in sorted(found))
            self.store.add_file(file_id, filename=f"{batch_id}_{kind}.jsonl", purpose=PURPOSE_OUTPUT,
                                owner=record.get("owner") or None, data=data, expires_at=expires_at)
            fields[f"{kind}_file_id"] = file_id
        if self.store.set_status(batch_id, {FINALIZING}, ending, fields):
            self.store.ended(batch_id, len(outputs), len(errors))
        self._lines.pop(batch_id, None)


def _dumps(line: dict[str, Any]) -> str:
    return jsonl([line]).decode().rstrip("\n")
