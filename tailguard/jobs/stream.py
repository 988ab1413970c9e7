"""A job's output as a Redis Stream: written by its worker, read by the API.

Why a Stream and not Celery's update_state: update_state overwrites and its
pub/sub is lossy, while a stream keeps every delta in order with an id, so a
client can resume from the last id it saw (SSE Last-Event-ID) and miss nothing.

Entries: ``type=delta data={"text": ...}`` any number of times, then exactly one
``type=end`` (written by JobStore.transition with the terminal state). An OpenAI job
(tailguard/engine/serving.py) writes vLLM's own output instead of deltas: a streamed one
``type=chunk data={"data": [<payload>, ...]}`` (vLLM's SSE ``data:`` payloads, JSON strings,
in order, as many per entry as its writer batched; no ``[DONE]``: the API adds it after the
end event), a non-streamed one a single ``type=response data={"body": <vLLM's response
JSON>}``; then the same end event. A follower may also get one ``type=error`` event that is
not in the stream: why following stopped before the end (Redis down too long, the job's
record gone); the job itself is untouched and the client can resume from the last id it saw.

The stream is the one copy of a job's output: the record keeps how the job ended, not
what it said (``output_text`` reads the text back for a reader of the whole result: the
deltas joined, or choice 0's text of an OpenAI job's chunks or response; ``response_body``
an OpenAI job's response), and the stream outlives the job's end by the output's TTL, the
record by the record's (tailguard/jobs/store.py).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import redis

from tailguard.errors import BrokerUnavailable, JobNotFound, TailguardError
from tailguard.jobs.store import TERMINAL
from tailguard.redis import keys, lua
from tailguard.redis.client import out_of_memory

log = logging.getLogger("tailguard.stream")

#: the entry types a worker writes (the end event is JobStore.transition's)
DELTA, CHUNK, RESPONSE = "delta", "chunk", "response"
#: How long a follower rides out a Redis outage (retrying, resuming from its last id) before
#: it ends the stream with an error event; and a worker, before it gives up writing a job's text.
OUTAGE_S = 30.0


#: A worker's stream entries per second (all its running jobs together) when
#: TAILGUARD_STREAM_WRITES_PER_S is empty, by the kind of host it runs on. On a CPU host each
#: entry is work for cores the engines need (docs/cpu-hosts.md). On a GPU host the bound is
#: Redis's, shared by the fleet (docs/capacity.md). 320 keeps every stream of the shipped lanes'
#: batches (16 and 8 slots) at the 50 ms base, where vLLM sends a chunk per step.
DEFAULT_WRITES_PER_S = {"cpu": 40.0, "cuda": 320.0}


def writes_per_s_for(device: str, configured: float | None) -> float:
    """The write budget of a worker on a `device` ("cpu" or "cuda") host: `configured`
    (TAILGUARD_STREAM_WRITES_PER_S) when set, else that host kind's default."""
    return DEFAULT_WRITES_PER_S[device] if configured is None else configured


def flush_interval(running: int, base_s: float, writes_per_s: float) -> float:
    """How long a job's writer batches text: `base_s`, stretched so that `running` jobs'
    streams together write at most `writes_per_s` entries per second (0: never stretched)."""
    if writes_per_s <= 0:
        return base_s
    return max(base_s, running / writes_per_s)


class DeltaWriter:
    """Batches a job's text deltas (`add`), or an OpenAI job's chunk payloads (`add_chunks`),
    into stream entries; used on one worker thread. A job writes one kind or the other.

    The first delta is written at once (time to first token is not held back), and so
    is the batch after `write_next_at_once` (an OpenAI job's first chunk with text, after
    its role chunk); later ones at most every `flush_s`, plus whatever is left at `close`.
    The batching counts entries, never payloads: a job's entries per second, and with them
    the process's write budget (`flush_interval`), are the same for both kinds.
    A non-streamed OpenAI job's response is one entry of its own (`write_response`).

    Redis may stall or restart while the engine generates. A failed write keeps its
    text pending for the next flush (the engine does not wait for Redis), and `close`
    is the write that must land: it retries through an outage of up to `outage_s`.
    Writes are idempotent: this writer's k-th entry has the explicit id ``0-k``, so a
    write that Redis applied but whose reply was lost (a stall past the client's
    socket timeout) is refused when retried, as an id at or below the stream's top,
    and counted as written instead of doubling the text. The end event (written with
    the terminal state) gets a time-based id, above every delta.
    """

    def __init__(self, client: redis.Redis, job_id: str, *, flush_s: float = 0.05,
                 maxlen: int = 10000, ttl_s: int = 86400, outage_s: float = OUTAGE_S) -> None:
        """`ttl_s`: the stream's TTL from its first write, at least the job's longest life
        (its record's while it runs: TAILGUARD_JOB_TTL_S); its end sets the output's."""
        self.client = client
        self._append = lua.Script(client, "append_delta")
        self.key = keys.job_stream_key(job_id)
        self.flush_s = flush_s
        self.maxlen = maxlen
        self.ttl_s = ttl_s
        self.outage_s = outage_s
        self._pending: list[str] = []
        self._kind = DELTA  # what _pending holds: text pieces, or chunk payloads
        self._last_flush: float | None = None
        self._error: redis.RedisError | None = None
        self.entries = 0

    def add(self, text: str) -> None:
        self._take(DELTA, [text])

    def add_chunks(self, payloads: list[str]) -> None:
        """vLLM's SSE payloads, in order: batched into ``chunk`` entries as text is."""
        self._take(CHUNK, payloads)

    def write_next_at_once(self) -> None:
        """Write the next batch at once, whenever the last one was written."""
        self._last_flush = None

    def write_response(self, body: str) -> None:
        """A non-streamed OpenAI job's response, as one ``response`` entry after anything
        pending; retried through an outage of up to `outage_s` like `close`."""
        self.close()
        self._pending, self._kind = [body], RESPONSE
        self.close()

    def _take(self, kind: str, items: list[str]) -> None:
        if self._pending and kind != self._kind:
            raise ValueError(f"a job's stream takes {self._kind} or {kind} entries, not both")
        self._kind = kind
        self._pending.extend(items)
        if self._last_flush is None or time.monotonic() - self._last_flush >= self.flush_s:
            self.flush()

    def tick(self) -> None:
        """Write what is pending if its batch is due (called while no delta arrives)."""
        if self._pending and time.monotonic() - (self._last_flush or 0.0) >= self.flush_s:
            self.flush()

    def flush(self) -> bool:
        """Write what is pending as one entry; False if Redis failed (the text stays pending)."""
        if not self._pending:
            return True
        self._last_flush = time.monotonic()
        try:
            self._write(self._kind, self._pending)
        except redis.ResponseError as exc:
            if out_of_memory(exc):  # Redis is full: room comes back as finished jobs expire
                return self._keep_pending(exc)
            if "equal or smaller" not in str(exc):
                raise
            # Landed before its reply was lost, or the stream already ended: nothing to add.
        except redis.RedisError as exc:
            return self._keep_pending(exc)
        self._pending, self._error = [], None
        self.entries += 1
        return True

    def _keep_pending(self, exc: redis.RedisError) -> bool:
        if self._error is None:
            log.warning("stream %s: Redis write failed (%s); the output stays pending and "
                        "is written once Redis answers", self.key, exc)
        self._error = exc
        return False

    def close(self) -> None:
        """Write everything pending, retrying for up to `outage_s`; past that, raise."""
        give_up = time.monotonic() + self.outage_s
        while not self.flush():
            if time.monotonic() > give_up:
                assert self._error is not None
                raise self._error
            time.sleep(0.5)

    def _write(self, kind: str, items: list[str]) -> None:
        data = ({"text": "".join(items)} if kind == DELTA else {"data": items} if kind == CHUNK
                else {"body": items[0]})
        self._append([self.key], client=self.client, id=f"0-{self.entries + 1}", maxlen=self.maxlen,
                     ttl_s=self.ttl_s, type=kind, data=json.dumps(data, ensure_ascii=False))


@dataclass(frozen=True)
class StreamEvent:
    id: str          # the stream entry id: the SSE id a client resumes from
    type: str        # "delta" | "chunk" | "response" | "end" | "error" (not in the stream;
    data: dict[str, Any]  # id: the last one read)

    @property
    def payloads(self) -> list[str]:
        """A ``chunk`` event's SSE payloads, in order (none for any other event)."""
        return list(self.data.get("data") or ()) if self.type == CHUNK else []


@dataclass(frozen=True)
class Output:
    """A finished job's text as its stream holds it. `expired`: the stream is gone (its TTL,
    TAILGUARD_OUTPUT_TTL_S, passed), so `text` is None; `truncated`: the stream's cap
    (TAILGUARD_STREAM_MAXLEN entries) dropped its first entries, so `text` is the rest."""

    text: str | None
    expired: bool = False
    truncated: bool = False


#: the id of a writer's first entry (DeltaWriter: the k-th is 0-k)
_FIRST_DELTA_ID = "0-1"


def output_text(client: redis.Redis, job_id: str) -> Output:
    """The text of a job that has ended (its stream holds its end event): its deltas joined,
    or an OpenAI job's choice 0's text, from its chunks or its response (`choice0_text`)."""
    entries = client.xrange(keys.job_stream_key(job_id))
    if not entries:
        return Output(None, expired=True)
    written = [(_text(entry_id), _text(fields.get(b"type", fields.get("type", b"delta"))),
                json.loads(fields.get(b"data", fields.get("data")))) for entry_id, fields in entries]
    written = [entry for entry in written if entry[1] in (DELTA, CHUNK, RESPONSE)]
    truncated = bool(written) and written[0][0] != _FIRST_DELTA_ID
    if any(kind != DELTA for _, kind, _ in written):
        return Output(choice0_text(
            [p for _, kind, data in written if kind == CHUNK for p in data["data"]],
            next((data["body"] for _, kind, data in written if kind == RESPONSE), None)),
            truncated=truncated)
    return Output("".join(data["text"] for _, _, data in written), truncated=truncated)


#: the Responses API's event of a piece of output text, and its output item of text
_TEXT_DELTA, _OUTPUT_TEXT = "response.output_text.delta", "output_text"


def choice0_text(payloads: list[str], response: str | None = None) -> str:
    """Choice 0's text of an OpenAI job: of its `response` body when it has one, else of its
    chunk `payloads` joined (a chat's ``delta.content``, a completion's ``text``); a
    Responses API job's output text (its response's ``output_text`` parts, or its events'
    text deltas)."""
    if response is not None:
        body = json.loads(response)
        if "output" in body and "choices" not in body:
            return "".join(part.get("text") or "" for item in body["output"] or ()
                           for part in item.get("content") or ()
                           if isinstance(part, dict) and part.get("type") == _OUTPUT_TEXT)
        choices = body.get("choices") or []
        first = next((c for c in choices if c.get("index", 0) == 0), {})
        return (first.get("message") or {}).get("content") or first.get("text") or ""
    parts = []
    for payload in payloads:
        chunk = json.loads(payload)
        if chunk.get("type") == _TEXT_DELTA:
            parts.append(chunk.get("delta") or "")
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) == 0:
                parts.append((choice.get("delta") or {}).get("content") or choice.get("text") or "")
    return "".join(parts)


def response_body(client: redis.Redis, job_id: str) -> str | None:
    """A non-streamed OpenAI job's response body (vLLM's JSON), once written; else None."""
    for _, fields in client.xrange(keys.job_stream_key(job_id)):
        if _text(fields.get(b"type", fields.get("type", b""))) == RESPONSE:
            return json.loads(fields.get(b"data", fields.get("data")))["body"]
    return None


def with_output(client: redis.Redis, job_id: str, job: dict[str, Any]) -> dict[str, Any]:
    """`job` (a record) with its result's text read back from its stream, once it has ended:
    null with ``text_expired`` once the stream's TTL passed, ``text_truncated`` when its cap
    cut the first entries (see Output)."""
    result = job.get("result")
    if job.get("status") not in TERMINAL or not isinstance(result, dict) or "text" in result:
        return job
    output = output_text(client, job_id)
    result = {**result, "text": output.text}
    if output.expired:
        result["text_expired"] = True
    if output.truncated:
        result["text_truncated"] = True
    return {**job, "result": result}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def error_event(after: str, err: TailguardError) -> StreamEvent:
    """Following ended early for `err`; `after` is the id to resume from."""
    return StreamEvent(after, "error", {"error": err.to_dict()})


def read_events(client: redis.Redis, job_id: str, after: str = "0-0",
                block_ms: int | None = None, count: int = 100) -> list[StreamEvent]:
    """Events after entry id `after`; with block_ms, wait up to that long for the first."""
    reply = client.xread({keys.job_stream_key(job_id): after}, count=count, block=block_ms)
    events = []
    for _key, entries in reply or []:
        for entry_id, fields in entries:
            entry_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
            f = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
                 for k, v in fields.items()}
            events.append(StreamEvent(entry_id, f.get("type", "delta"), json.loads(f.get("data", "{}"))))
    return events


_STREAM_ID_PARTS = 2


def valid_stream_id(value: str) -> bool:
    """A Last-Event-ID we can pass to XREAD: `<ms>-<seq>`."""
    parts = value.split("-")
    return len(parts) == _STREAM_ID_PARTS and all(p.isdigit() for p in parts)


def follow(client: redis.Redis, job_id: str, after: str = "0-0", *,
           heartbeat_s: float = 2.0, status: Callable[[], str | None] | None = None,
           outage_s: float = OUTAGE_S) -> Iterator[StreamEvent | None]:
    """Yield a job's events until its end event; None every `heartbeat_s` of silence.

    `status` is asked at each silence for the job's state (the API settles overdue jobs
    there, which writes their end event); None means the record is gone. Following ends
    without an end event when the job is terminal and nothing follows `after` (a
    Last-Event-ID at or past the end), and with an error event when the record is gone
    or Redis has not answered for `outage_s`. A Redis error before that is retried,
    resuming after the last id read: a blip neither ends the stream nor touches the job.
    """
    down_since: float | None = None
    while True:
        try:
            events = read_events(client, job_id, after, block_ms=max(1, int(heartbeat_s * 1000)))
            state = status() if status is not None and not events else ""
            if state in TERMINAL:  # it may have ended just now (settled by `status`)
                events = read_events(client, job_id, after)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            now = time.monotonic()
            down_since = now if down_since is None else down_since
            if now - down_since >= outage_s:
                yield error_event(after, BrokerUnavailable(
                    f"Redis did not answer for {outage_s:.0f} s ({exc}); resume from the last "
                    "event id later"))
                return
            yield None
            time.sleep(min(heartbeat_s, 1.0))
            continue
        down_since = None
        if not events:
            if state is None:
                yield error_event(after, JobNotFound(f"job {job_id}'s record expired"))
                return
            if state in TERMINAL:
                return  # its end event is at or before `after`: the client has it
            yield None
            continue
        for event in events:
            after = event.id
            yield event
            if event.type == "end":
                return
