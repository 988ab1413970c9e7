"""What the gateway does with every finished request: one log line, metrics, stats.

Every terminal transition appends the job to the `tailguard:finished` stream
(tailguard/jobs/store.py). The API reads it through a consumer group, so each
finished request is logged and counted exactly once however many API processes
run, including requests whose client never came back for the result, and those
an API process read but died before acking (another one claims them). All
timings come from the job record (one clock: Redis's), never from this process.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import redis

from tailguard.jobs.store import TERMINAL, decode
from tailguard.redis import keys

log = logging.getLogger("tailguard.finished")
request_log = logging.getLogger("tailguard.requests")

GROUP = "gateway"
#: An entry delivered to a consumer and not acked for this long is taken over by another:
#: its API process died between reading and acking (handling takes milliseconds).
CLAIM_IDLE_MS = 30_000
#: How often a consumer trims the stream's entries older than its records live.
TRIM_EVERY_S = 60.0


@dataclass(frozen=True)
class FinishedRequest:
    """One finished request, as logged and measured."""

    id: str
    lane: str | None
    priority: str | None
    status: str
    prompt_tokens: int | None
    requested_max_tokens: int | None
    max_tokens: int | None
    max_tokens_capped: bool
    completion_tokens: int | None
    finish_reason: str | None
    queued_s: float | None    # submitted -> started on a worker
    ttft_s: float | None      # submitted -> first token
    e2e_s: float | None       # submitted -> terminal state
    engine_s: float | None    # started -> terminal state
    tpot_s: float | None      # time per output token after the first
    worker: str | None
    error: str | None         # error code, when not succeeded
    finished_at: float        # Redis clock
    api_key: str | None = None  # the name of the API key that submitted it

    def log_line(self) -> str:
        return json.dumps({"event": "request_finished", **asdict(self)}, ensure_ascii=False,
                          separators=(",", ":"))


def finished_request(job_id: str, job: dict[str, Any]) -> FinishedRequest:
    """Build the record from a job hash (see tailguard.jobs for the fields)."""
    status = job["status"]
    submitted = job.get("submitted_at")
    started = job.get("running_at")
    ended = job.get(f"{status}_at")
    engine_ttft = job.get("ttft_s")
    result = job.get("result") or {}
    completion = job.get("completion_tokens", result.get("completion_tokens"))
    queued = started - submitted if started and submitted else None
    e2e = ended - submitted if ended and submitted else None
    engine = ended - started if ended and started else None
    ttft = queued + engine_ttft if queued is not None and engine_ttft is not None else None
    tpot = ((engine - engine_ttft) / (completion - 1)
            if engine is not None and engine_ttft is not None and completion and completion > 1
            else None)
    return FinishedRequest(
        id=job_id, lane=job.get("lane"), priority=job.get("priority"), status=status,
        prompt_tokens=job.get("prompt_tokens"), requested_max_tokens=job.get("requested_max_tokens"),
        max_tokens=job.get("max_tokens"), max_tokens_capped=bool(job.get("max_tokens_capped")),
        completion_tokens=completion, finish_reason=result.get("finish_reason"),
        queued_s=_r(queued), ttft_s=_r(ttft), e2e_s=_r(e2e), engine_s=_r(engine), tpot_s=_r(tpot),
        worker=job.get("worker"), error=(job.get("error") or {}).get("code"),
        api_key=job.get("api_key"),
        finished_at=ended or 0.0)


def _r(x: float | None) -> float | None:
    return None if x is None else round(max(0.0, x), 6)


class FinishedConsumer:
    """Reads the finished stream and hands each record to `sinks` (log, metrics, stats)."""

    def __init__(self, client: redis.Redis, sinks: list[Callable[[FinishedRequest], None]], *,
                 consumer: str | None = None, claim_idle_ms: int = CLAIM_IDLE_MS,
                 keep_s: float | None = None) -> None:
        self.client = client
        self.claim_idle_ms = claim_idle_ms
        # entries older than this name records gone by now (TAILGUARD_RECORD_TTL_S): trimmed,
        # so the stream holds about a record TTL's worth instead of growing to its cap
        self.keep_s = keep_s
        self._next_trim = 0.0
        self.sinks = sinks
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._group_ready = False

    def _ensure_group(self) -> None:
        if self._group_ready:
            return
        try:
            # From the start of the stream: requests that finished while no API ran count too.
            self.client.xgroup_create(keys.FINISHED_STREAM, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    def run_once(self, block_ms: int | None = None, count: int = 200) -> int:
        """Handle what is waiting (own pending entries first); returns how many were handled."""
        try:
            return self._run_once(block_ms, count)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            # Redis lost the stream (a restart without persistence, a flush): start over.
            self._group_ready = False
            return self._run_once(block_ms, count)

    def _run_once(self, block_ms: int | None, count: int) -> int:
        self._ensure_group()
        # Entries a dead API process read but never acked, taken over once idle long enough.
        _next, claimed, *_ = self.client.xautoclaim(keys.FINISHED_STREAM, GROUP, self.consumer,
                                                    self.claim_idle_ms, "0-0", count=count)
        handled = self._handle_all(claimed)
        for start in ("0", ">"):  # "0": entries delivered to us before but not acked (a crash)
            reply = self.client.xreadgroup(GROUP, self.consumer, {keys.FINISHED_STREAM: start},
                                           count=count, block=block_ms if start == ">" else None)
            for _stream, entries in reply or []:
                handled += self._handle_all(entries)
        self._trim()
        return handled

    def _trim(self) -> None:
        """Drop the entries older than keep_s, at most once a TRIM_EVERY_S (this process's
        clock paces it; the cutoff is Redis's: entry ids are its milliseconds)."""
        if self.keep_s is None or time.monotonic() < self._next_trim:
            return
        self._next_trim = time.monotonic() + TRIM_EVERY_S
        seconds, micros = self.client.time()
        now = seconds + micros / 1e6
        self.client.xtrim(keys.FINISHED_STREAM, minid=f"{int((now - self.keep_s) * 1000)}-0",
                          approximate=True)

    def _handle_all(self, entries: list) -> int:
        for entry_id, fields in entries:
            if fields:  # None: the entry was trimmed meanwhile (Redis 6.2 still lists it)
                self._handle(fields)
            self.client.xack(keys.FINISHED_STREAM, GROUP, entry_id)
        return len(entries)

    def _handle(self, fields: dict) -> None:
        key = (fields.get(b"key") or fields.get("key") or b"")
        key = key.decode() if isinstance(key, bytes) else key
        job_id = key.rsplit(":", 1)[-1]
        raw = self.client.hgetall(key)
        if not raw:
            return  # the record expired before we got to it
        job = decode(raw)
        if job.get("status") not in TERMINAL:
            return
        record = finished_request(job_id, job)
        for sink in self.sinks:
            try:
                sink(record)
            except Exception:  # one bad sink must not stop the others
                log.exception("finished-request sink %r failed", sink)

    def start(self) -> None:
        """Consume in a daemon thread until stop()."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="tailguard-finished", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once(block_ms=1000)
            except redis.RedisError as exc:
                log.warning("finished-stream consumer: %s", exc)
                self._group_ready = False
                self._stop.wait(2.0)

    def stop(self) -> None:
        self._stop.set()


def log_request(record: FinishedRequest) -> None:
    """The request log: one JSON line per finished request."""
    request_log.info(record.log_line())


class JobEnds:
    """Wakes the callers waiting for jobs to end (long polls, non-streamed OpenAI calls).

    One thread per process follows the finished stream with a blocking read (no consumer
    group: every process sees every entry) and sets the event of each job someone here
    waits for. However many wait, that is one read per batch of finished jobs, where
    each waiter used to read its record every 50 ms. The stream is persistent: after a
    Redis error the thread reads on from the last id it saw, and an end it still missed
    (the stream trimmed meanwhile) costs only the waiter's next backstop read.
    """

    def __init__(self, client: redis.Redis, *, block_ms: int = 1000, count: int = 500) -> None:
        self.client = client
        self.block_ms = block_ms
        self.count = count
        self._lock = threading.Lock()
        self._waiters: dict[str, set[threading.Event]] = {}
        self._after = "0-0"  # the last entry read
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    @contextmanager
    def watch(self, job_id: str) -> Iterator[threading.Event]:
        """An event set once the job's end is announced: enter before reading the job's state,
        so an end announced after that read is never missed."""
        self._start()
        ended = threading.Event()
        with self._lock:
            self._waiters.setdefault(job_id, set()).add(ended)
        try:
            yield ended
        finally:
            with self._lock:
                waiting = self._waiters.get(job_id, set())
                waiting.discard(ended)
                if not waiting:
                    self._waiters.pop(job_id, None)

    def waiting(self) -> int:
        """How many jobs someone here waits for."""
        with self._lock:
            return len(self._waiters)

    def _start(self) -> None:
        """Start following, from the stream's newest entry as it is now (once per process:
        its first waiter starts it; Redis down raises to that waiter)."""
        with self._lock:
            if self._thread is not None:
                return
            newest = self.client.xrevrange(keys.FINISHED_STREAM, count=1)
            self._after = _text(newest[0][0]) if newest else "0-0"
            self._thread = threading.Thread(target=self._follow, name="tailguard-job-ends",
                                            daemon=True)
            self._thread.start()

    def _follow(self) -> None:
        failing = False
        while not self._stop.is_set():
            try:
                reply = self.client.xread({keys.FINISHED_STREAM: self._after}, count=self.count,
                                          block=self.block_ms)
            except Exception as exc:  # noqa: BLE001 - the follower outlives any error; waiters fall back on their backstop reads meanwhile
                if not failing and not self._stop.is_set():
                    log.warning("following the finished stream: %s (retrying every second)", exc)
                failing = True
                self._stop.wait(1.0)
                continue
            failing = False
            for _stream, entries in reply or []:
                for entry_id, fields in entries:
                    self._after = _text(entry_id)
                    key = _text((fields or {}).get(b"key") or (fields or {}).get("key") or b"")
                    with self._lock:
                        waiting = list(self._waiters.get(keys.job_id_of(key), ()))
                    for ended in waiting:
                        ended.set()

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop following (within one blocking read; `timeout_s`: wait that long for it)."""
        self._stop.set()
        if timeout_s is not None and self._thread is not None:
            self._thread.join(timeout_s)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

