"""Open-loop load: every request is sent at its arrival time, whatever the others are doing.

Each request is a streamed ``POST /v1/completions`` (``stream: true``), so the
client sees its first token: TTFT is measured here, from sending the request to
the first chunk with text (an output with no text at all: its first chunk, as
vLLM's ``bench serve`` takes it); end-to-end from sending to ``data: [DONE]``; the
inter-token latency, as vLLM's ``bench serve`` takes it, is the gaps between
one chunk with text and the next (a chunk may carry several tokens). The
response's ``X-Tailguard-Job-Id`` names the job, whose ``/v1/jobs/<id>`` timing
gives the queue wait (submission to start on a worker, on Redis's clock).
Against a plain vLLM server (``jobs=False``: the `direct` topology) there is no
job: a request is accepted when answered 200 and finished when its stream ends,
and each class may carry a vLLM ``priority``.

A refusal is a 429 (tailguard's admission) or a 503 (vLLM's ``--max-num-queued-reqs``,
tailguard's ``unavailable``). With ``retries`` the client sends a refused request again
as the openai SDK does by default (`retry_delay`: twice, after ``Retry-After`` when it
is between 0 and 60 s, else after its exponential backoff); its latency is counted from
the first send.

Requests are sent from a thread pool large enough to keep every request of the
phase in flight; if it ever is not, the lateness shows in ``lag_s`` (and the
report says so) instead of silently turning the load closed-loop. Only the
standard library: no HTTP client to install, and nothing else to import.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

from tailguard.bench.sessions import Session, turn_prompt
from tailguard.bench.workload import BenchRequest

#: Job states that end a job (tailguard.jobs.store.TERMINAL, repeated so this module stays import-light).
TERMINAL = frozenset({"succeeded", "failed", "expired", "cancelled"})
#: Outcomes decided by the client, which the job's own status must not overwrite.
CLIENT_FAILURES = frozenset({"http_error", "client_error", "timeout"})
#: The API answered 429 (or 503): refused at admission, nothing queued (not a failure of the
#: system); `Sample.http_status` tells which.
REFUSED = "refused"
#: The answers that refuse a request for now (`REFUSED`), and that a client retries.
REFUSED_STATUSES = frozenset({429, 503})
#: The openai SDK's default retry schedule (openai/_constants.py): retries, the first
#: backoff, the longest. Retry-After is honoured when within (0, RETRY_AFTER_MAX_S]: the
#: SDK's cap since 1.x (3.x raised it to 120 s; what clients deployed today mostly do).
SDK_RETRIES = 2
INITIAL_RETRY_DELAY_S = 0.5
MAX_RETRY_DELAY_S = 8.0
RETRY_AFTER_MAX_S = 60.0
#: How often `settle` asks again for a job's state refused with 429 (the key's waits are full).
SETTLE_TRIES = 30
#: Socket read timeout: the API sends an SSE heartbeat every ~2 s, so silence this long is a fault.
#: A plain vLLM server sends nothing while a request waits in its queue: against it a stream
#: may be silent until the phase's deadline (an overloaded engine is slow, not broken).
READ_TIMEOUT_S = 60.0


@dataclass
class Sample:
    """One request as the client saw it. Times are seconds; *_s offsets are from the phase start."""

    cls: str
    max_tokens: int
    arrival_s: float  # when it was due
    sent_s: float | None = None  # when it was sent
    status: str = "not_sent"  # the job's final status, REFUSED, or one of CLIENT_FAILURES
    ok: bool = False  # succeeded and streamed to the end, not cut by the lane deadline
    accepted: bool = False  # the API answered with a job id
    finished: bool = False  # that job reached a terminal state
    job_id: str | None = None
    lane: str | None = None
    worker: str | None = None  # the worker that ran the job
    http_status: int | None = None
    queued_s: float | None = None  # server: submission -> start on a worker
    #: server: the worker's generate() call -> the engine's first token (the rest of the
    #: client's TTFT is the API, the queue and the token stream)
    engine_ttft_s: float | None = None
    #: server: submission -> the job's end (so e2e_s minus this is the API and the stream)
    server_e2e_s: float | None = None
    #: sent -> the API stored the job (its Redis-clock stamp; the same host's clock)
    submit_delay_s: float | None = None
    sent_at: float | None = None  # wall clock at sending, for submit_delay_s
    ttft_s: float | None = None  # client: sent -> first chunk with text
    e2e_s: float | None = None  # client: sent -> data: [DONE]
    completion_tokens: int | None = None
    prompt_tokens: int | None = None  # as the server counted them (the stream's usage)
    planned_prompt_tokens: int | None = None  # as the workload built the prompt
    chunks: int = 0  # stream chunks with text
    itl_s: list[float] = field(default_factory=list)  # gaps between them (len: chunks - 1)
    finish_reason: str | None = None  # the job's: length, stop or deadline
    error: str | None = None
    refusal: str | None = None  # a refusal's error code (lane_full, wait_too_long, 503...)
    retry_after_s: float | None = None  # a refusal's Retry-After, None when it had none
    attempts: int = 0  # requests sent (1 + retries of refusals)
    refused_at: list[float] = field(default_factory=list)  # wall clock of each refusal answer
    session: int | None = None  # chat: its session (shared-doc: its document)
    turn: int = 0  # chat: its turn in the session
    round: int = 1  # its topology's run in the bench (a topology named twice runs twice)

    @property
    def lag_s(self) -> float | None:
        return None if self.sent_s is None else self.sent_s - self.arrival_s

    @property
    def decode_tok_s(self) -> float | None:
        """This request's output rate after its first token."""
        if not self.ok or not self.completion_tokens or self.completion_tokens < 2:
            return None
        span = (self.e2e_s or 0) - (self.ttft_s or 0)
        return (self.completion_tokens - 1) / span if span > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Sample:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


class Client:
    """The tailguard API at `url`, or with `jobs=False` a plain vLLM OpenAI server sent each
    class's vLLM `priorities` (loopback only: a benchmark must not load anyone else)."""

    def __init__(self, url: str, model: str, *, jobs: bool = True,
                 priorities: dict[str, int] | None = None,
                 api_keys: dict[str, str] | None = None, api_key: str | None = None,
                 retries: int = 0, rng: random.Random | None = None):
        parts = urlsplit(url)
        if parts.hostname not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"the benchmark only drives a local system, not {url}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.model = model
        self.jobs = jobs
        self.priorities = priorities or {}
        #: the API key each class's requests are sent with (an API in keys mode), and the one
        #: for everything else
        self.api_keys = api_keys or {}
        self.api_key = api_key
        #: refusals retried per request (`retry_delay`), and the jitter's random source
        self.retries = retries
        self.rng = rng or random.Random(0)

    def _auth(self, cls: str | None = None) -> dict[str, str]:
        secret = self.api_keys.get(cls or "", self.api_key)
        return {"Authorization": f"Bearer {secret}"} if secret else {}

    def _conn(self, timeout: float = READ_TIMEOUT_S) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def get_json(self, path: str, timeout: float = 30.0, cls: str | None = None) -> tuple[int, Any]:
        return self.request_json("GET", path, timeout=timeout, cls=cls)

    def request_json(self, method: str, path: str, body: bytes | None = None,
                     content_type: str | None = None,
                     timeout: float = 30.0, cls: str | None = None) -> tuple[int, Any]:
        """(status, the body as JSON, else as text) of one request (with `cls`'s API key)."""
        conn = self._conn(timeout)
        try:
            conn.request(method, path, body=body,
                         headers={**({"content-type": content_type} if content_type else {}),
                                  **self._auth(cls)})
            resp = conn.getresponse()
            body = resp.read()
            try:
                return resp.status, json.loads(body)
            except ValueError:
                return resp.status, body.decode(errors="replace")
        finally:
            conn.close()

    def stream(self, req: BenchRequest, sample: Sample, t0: float, deadline: float,
               answer: list[str] | None = None) -> None:
        """Send one streamed completion (again after a refusal, up to `retries` times) and
        fill `sample` in, the text streamed into `answer` when given; never raises."""
        fields = {"model": self.model, "prompt": req.prompt, "max_tokens": req.max_tokens,
                  "ignore_eos": req.ignore_eos, "stream": True,
                  "stream_options": {"include_usage": True}}
        if req.cls in self.priorities:
            fields["priority"] = self.priorities[req.cls]
        body = json.dumps(fields).encode()
        sent = time.perf_counter()  # latency counts from the first send, retries included
        sample.sent_s = sent - t0
        sample.sent_at = time.time()
        done = self._send(body, req, sample, sent, deadline, answer)
        while sample.status == REFUSED and sample.attempts <= self.retries:
            delay = retry_delay(sample.attempts - 1, sample.retry_after_s, self.rng.random())
            if time.perf_counter() + delay > deadline:
                break
            time.sleep(delay)
            done = self._send(body, req, sample, sent, deadline, answer)
        if sample.accepted and self.jobs:
            self.settle(sample, wait_s=5 if done else 0)
        elif sample.accepted:  # a plain server: the stream is all there is
            sample.finished = done
            if sample.status not in CLIENT_FAILURES:
                sample.status = "succeeded" if done and sample.error is None else "failed"
        sample.ok = (done and sample.status == "succeeded" and sample.error is None
                     and sample.finish_reason != "deadline")
        if done and sample.finish_reason == "deadline":
            sample.error = "cut by the lane deadline"

    def _send(self, body: bytes, req: BenchRequest, sample: Sample, sent: float,
              deadline: float, answer: list[str] | None = None) -> bool:
        """One attempt: whether its stream reached [DONE]; a refusal leaves `sample` REFUSED."""
        sample.attempts += 1
        if answer is not None:
            answer.clear()
        sample.status, sample.error, sample.refusal, sample.retry_after_s = "sent", None, None, None
        conn = self._conn(READ_TIMEOUT_S if self.jobs else
                          max(READ_TIMEOUT_S, min(deadline - time.perf_counter(), 86400.0)))
        try:
            conn.request("POST", "/v1/completions", body=body,
                         headers={"content-type": "application/json", **self._auth(req.cls)})
            resp = conn.getresponse()
            sample.http_status = resp.status
            if resp.status in REFUSED_STATUSES:
                self._refused(resp, sample)
                return False
            if resp.status != 200:
                sample.status = "http_error"
                sample.error = f"HTTP {resp.status}: {resp.read()[:300].decode(errors='replace')}"
                return False
            sample.job_id = resp.getheader("X-Tailguard-Job-Id")
            sample.lane = resp.getheader("X-Tailguard-Lane")
            sample.accepted = sample.job_id is not None or not self.jobs
            return self._read_events(resp, sample, sent, deadline, answer)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            sample.status, sample.error = "client_error", f"{type(exc).__name__}: {exc}"
            return False
        finally:
            conn.close()  # mid-stream, this makes the API cancel the job

    def _read_events(self, resp: http.client.HTTPResponse, sample: Sample, sent: float,
                     deadline: float, answer: list[str] | None = None) -> bool:
        """Read a 200's event stream into `sample` (TTFT, gaps, chunks, usage, an error event)
        until [DONE] (True) or its end or the phase's deadline (False)."""
        last_text: float | None = None
        first_choice: float | None = None  # an output of no text at all: its TTFT, as vLLM's
        while True:
            line = resp.readline()
            now = time.perf_counter()
            if not line:
                break
            if now > deadline:
                sample.status, sample.error = "timeout", "still running at the phase's end"
                break
            if not line.startswith(b"data: "):
                continue  # blank separators and ": keep-alive" heartbeats
            data = line[6:].strip()
            if data == b"[DONE]":
                sample.e2e_s = now - sent
                if sample.ttft_s is None and first_choice is not None:
                    sample.ttft_s = first_choice - sent
                return True
            chunk = json.loads(data)
            if "error" in chunk:
                sample.error = json.dumps(chunk["error"], ensure_ascii=False)[:300]
                continue
            if chunk.get("usage"):
                sample.completion_tokens = chunk["usage"].get("completion_tokens")
                sample.prompt_tokens = chunk["usage"].get("prompt_tokens")
            choices = chunk.get("choices") or ()
            if choices and first_choice is None:
                first_choice = now
            if answer is not None:
                answer.extend(c.get("text") or "" for c in choices)
            if any(c.get("text") for c in choices):
                if last_text is None:
                    sample.ttft_s = now - sent
                else:
                    sample.itl_s.append(round(now - last_text, 6))
                last_text = now
                sample.chunks += 1
            if not self.jobs:
                sample.finish_reason = next((c["finish_reason"] for c in choices
                                             if c.get("finish_reason")), sample.finish_reason)
        return False

    @staticmethod
    def _refused(resp: http.client.HTTPResponse, sample: Sample) -> None:
        """A 429 or 503: when, its code and Retry-After (left None when absent or not a number
        of seconds)."""
        sample.status = REFUSED
        sample.refused_at.append(round(time.time(), 3))
        try:
            sample.retry_after_s = float(resp.getheader("Retry-After") or "")
        except ValueError:
            pass
        body = resp.read()[:2000]
        try:
            sample.refusal = str(json.loads(body)["error"]["code"])
        except (ValueError, KeyError, TypeError):
            sample.error = f"HTTP {resp.status}: {body[:300].decode(errors='replace')}"

    def settle(self, sample: Sample, wait_s: float = 0) -> None:
        """Read the job's final state and queue wait from /v1/jobs/<id>."""
        try:
            for _ in range(SETTLE_TRIES):
                code, job = self.get_json(f"/v1/jobs/{sample.job_id}?wait={wait_s:g}",
                                          timeout=wait_s + 30, cls=sample.cls)
                if code != 429:
                    break
                # the key holds its most open waits (TAILGUARD_MAX_WAITS_PER_KEY): its own
                # streams, a flood's; read again once one has ended
                time.sleep(1.0)
        except (OSError, http.client.HTTPException) as exc:
            sample.error = sample.error or f"job status: {type(exc).__name__}: {exc}"
            return
        if code != 200 or not isinstance(job, dict):
            sample.error = sample.error or f"job status: HTTP {code}"
            return
        sample.finished = job["status"] in TERMINAL
        if sample.status not in CLIENT_FAILURES:
            sample.status = job["status"]
        timing = job.get("timing") or {}
        sample.queued_s = timing.get("queued_s")
        sample.engine_ttft_s = timing.get("engine_ttft_s")
        sample.server_e2e_s = timing.get("e2e_s")
        if sample.sent_at is not None and isinstance(timing.get("submitted_at"), (int, float)):
            sample.submit_delay_s = round(timing["submitted_at"] - sample.sent_at, 6)
        sample.worker = job.get("worker")
        result = job.get("result") or {}
        if sample.completion_tokens is None:
            sample.completion_tokens = result.get("completion_tokens")
        sample.finish_reason = result.get("finish_reason")
        if job.get("error") and sample.error is None:
            sample.error = json.dumps(job["error"], ensure_ascii=False)[:300]


def retry_delay(retries_done: int, retry_after_s: float | None, jitter: float) -> float:
    """Seconds the openai SDK waits before its next retry (its `_calculate_retry_timeout`):
    the server's Retry-After when within (0, RETRY_AFTER_MAX_S], else 0.5 s doubled per
    retry already made, at most 8 s, less up to a quarter (`jitter` in [0, 1))."""
    if retry_after_s is not None and 0 < retry_after_s <= RETRY_AFTER_MAX_S:
        return retry_after_s
    backoff = min(INITIAL_RETRY_DELAY_S * 2.0 ** retries_done, MAX_RETRY_DELAY_S)
    return backoff * (1 - 0.25 * jitter)


def run_phase(client: Client, requests: tuple[BenchRequest, ...] | list[BenchRequest], *,
              duration_s: float, drain_s: float, max_in_flight: int = 512,
              on_done: Callable[[Sample], None] | None = None) -> list[Sample]:
    """Send `requests` at their arrival times; return when all are done or time is up.

    Time is bounded: requests arrive within `duration_s` and any still running
    `drain_s` after it are abandoned (closing the stream cancels the job) and
    reported as `timeout`. Jobs that did not end are looked up once more at the end.
    """
    samples = [Sample(r.cls, r.max_tokens, r.arrival_s, planned_prompt_tokens=r.prompt_tokens,
                      session=r.session, turn=r.turn) for r in requests]
    t0 = time.perf_counter() + 0.1
    deadline = t0 + max(duration_s, max((r.arrival_s for r in requests), default=0)) + drain_s
    lock = threading.Lock()

    def one(i: int) -> None:
        try:
            client.stream(requests[i], samples[i], t0, deadline)
        finally:
            if on_done is not None:
                with lock:
                    on_done(samples[i])

    pool = ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="bench")
    try:
        for i, req in enumerate(requests):
            delay = t0 + req.arrival_s - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            if time.perf_counter() > deadline:
                break
            pool.submit(one, i)
    except BaseException:
        # Interrupted: send nothing more and do not wait; the streams in flight end
        # when the caller stops the topology.
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    for s in samples:
        if s.accepted and not s.finished and client.jobs:
            client.settle(s, wait_s=10)
    return samples


def run_sessions(client: Client, sessions: Sequence[Session], *, duration_s: float,
                 drain_s: float, max_in_flight: int = 512,
                 on_done: Callable[[Sample], None] | None = None) -> list[Sample]:
    """Start each session at its arrival time (open loop) and send its turns one after another:
    a turn after the previous answer has arrived and the turn's think time has passed, its
    prompt the conversation with the answers as streamed (tailguard/bench/sessions.py). A
    session whose turn failed sends no more (its later turns stay ``not_sent``), as a user
    whose answer never came. A turn's `Sample.arrival_s` is when it became due; its lag,
    the time it waited past that for a sender. Bounded in time as `run_phase`."""
    samples = {s.id: [Sample(s.cls, t.max_tokens, s.arrival_s, session=s.id, turn=k)
                      for k, t in enumerate(s.turns)] for s in sessions}
    t0 = time.perf_counter() + 0.1
    deadline = t0 + max(duration_s, max((s.arrival_s for s in sessions), default=0)) + drain_s
    lock = threading.Lock()

    def done(sample: Sample) -> None:
        if on_done is not None:
            with lock:
                on_done(sample)

    def one(session: Session) -> None:
        users: list[str] = []
        answers: list[str] = []
        mine = samples[session.id]
        for k, turn in enumerate(session.turns):
            sample = mine[k]
            if k:
                sample.arrival_s = time.perf_counter() + turn.think_s - t0
                if t0 + sample.arrival_s > deadline:
                    sample.error = "due after the phase's end"
                    for rest in mine[k:]:
                        done(rest)
                    return
                time.sleep(turn.think_s)
            users.append(turn.user)
            req = BenchRequest(session.cls, turn_prompt(session.system, users, answers),
                               turn.max_tokens, sample.arrival_s, session=session.id, turn=k)
            answer: list[str] = []
            client.stream(req, sample, t0, deadline, answer)
            done(sample)
            if not sample.ok:
                for rest in mine[k + 1:]:
                    rest.error = f"turn {k} of its session failed"
                    done(rest)
                return
            answers.append("".join(answer))

    pool = ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="bench-session")
    try:
        for session in sorted(sessions, key=lambda s: s.arrival_s):
            delay = t0 + session.arrival_s - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            if time.perf_counter() > deadline:
                break
            pool.submit(one, session)
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)  # as run_phase
        raise
    pool.shutdown(wait=True)
    out = [sample for s in sessions for sample in samples[s.id]]
    for sample in out:  # as run_phase: jobs that did not end, looked up once more
        if sample.accepted and not sample.finished and client.jobs:
            client.settle(sample, wait_s=10)
    return out


def closed_loop(client: Client, request: BenchRequest, *, concurrency: int, duration_s: float,
                drain_s: float) -> list[Sample]:
    """`concurrency` senders, each sending `request` again as soon as its previous one ends, for
    `duration_s`: a load that keeps a lane saturated without growing its queue without end.
    A refused sender waits (at most 1 s of the Retry-After) before sending again."""
    t0 = time.perf_counter()
    deadline = t0 + duration_s + drain_s
    out: list[Sample] = []
    lock = threading.Lock()

    def sender() -> None:
        while (now := time.perf_counter()) - t0 < duration_s:
            sample = Sample(request.cls, request.max_tokens, now - t0)
            client.stream(request, sample, t0, deadline)
            with lock:
                out.append(sample)
            if sample.status == REFUSED:
                time.sleep(min(sample.retry_after_s or 1.0, 1.0))

    threads = [threading.Thread(target=sender, name=f"probe-{i}", daemon=True)
               for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(out, key=lambda s: s.arrival_s)


def served_model_name(url: str, api_key: str | None = None) -> str:
    """The `model` name the API answers to (its first /v1/models entry)."""
    code, body = Client(url, "", api_key=api_key).get_json("/v1/models")
    if code != 200:
        raise RuntimeError(f"GET /v1/models answered {code}: {body}")
    return body["data"][0]["id"]
