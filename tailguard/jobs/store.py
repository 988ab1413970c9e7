"""Job records in Redis and the one state machine every job follows.

    queued ──► running ──► succeeded | failed | cancelled
       │
       └─────► expired | cancelled | failed

Every change to a terminal state also appends the terminal event to the job's
Redis Stream in the same atomic step, so a stream reader always learns how the
job ended, whoever ended it.

Every change of state is an atomic compare-and-set in a Lua script that also
stamps ``<state>_at`` from the Redis server clock, so queue wait and latency
are differences of one clock, never of the API's and a worker's. A transition
that loses a race (the job was cancelled or expired meanwhile) does nothing and
says so, which is what lets a late Celery SUCCESS never overwrite a terminal
state and makes a redelivered task a no-op.

Storage is bounded by time (docs/reliability.md, "Bounded storage"): a record lives at
most ``ttl_s`` (TAILGUARD_JOB_TTL_S) from submission while its job is queued or running,
and once the job ends, ``record_ttl_s`` (state, token counts, timings, error) and its
stream, the one copy of its text, ``output_ttl_s``: the terminal transition sets both.
The record keeps the result without its text (``output_text`` in tailguard/jobs/stream.py
reads it back).

The same step keeps the index of running jobs (``keys.RUNNING_JOBS``: job ->
worker), which the reaper (tailguard/jobs/reaper.py) reads to fail, within seconds, the
jobs of a worker that stopped heart-beating, and each lane's running jobs on its own
workers (``keys.lane_running_key``), the batch slots in use that admission counts
(tailguard/lanes/admission.py). As a backstop the API also settles
overdue jobs when it reads them (queued past its queue TTL -> expired, running far
past its deadline -> failed/worker_lost), so no accepted request can stay "queued"
or "running" forever even if every worker is gone.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import redis

from tailguard import settings
from tailguard.errors import ConfigError, JobExpired, JobStateConflict, WorkerLost
from tailguard.jobs.redis_memory import StorageWatch
from tailguard.lanes.admission import BacklogLimits, LaneLoad
from tailguard.redis import keys, lua

QUEUED, RUNNING = "queued", "running"
SUCCEEDED, FAILED, EXPIRED, CANCELLED = "succeeded", "failed", "expired", "cancelled"
TERMINAL = frozenset({SUCCEEDED, FAILED, EXPIRED, CANCELLED})
STATES = frozenset({QUEUED, RUNNING}) | TERMINAL

#: Approximate cap on the stream of finished jobs: its consumer (tailguard.jobs.finished) keeps up
#: within seconds, so this only bounds it while no API process reads it.
FINISHED_STREAM_MAXLEN = 100_000

# fields stored as JSON (the rest are strings or numbers)
_JSON_FIELDS = ("result", "error", "sampling", "timing")
_FLOAT_FIELDS = ("submitted_at", "expires_at", "deadline_s", "queued_at", "running_at",
                 "succeeded_at", "failed_at", "expired_at", "cancelled_at", "ttft_s")
_INT_FIELDS = ("prompt_tokens", "max_tokens", "requested_max_tokens", "completion_tokens", "cost",
               "engine_prompt_tokens", "engine_deaths", "slo_ttft_ms", "slo_tpot_ms")


#: the lane keys transition_job.lua keeps as a job is queued and runs (%s: the lane)
_LANE_KEY_PATTERNS = {"queued": keys.lane_queued_key("%s"), "backlog": keys.lane_backlog_key("%s"),
                      "running": keys.lane_running_key("%s"), "workers": keys.lane_workers_key("%s")}


def _encode(fields: dict[str, Any]) -> dict[str, str]:
    """Job fields as the strings stored in the hash (None: not stored)."""
    out: dict[str, str] = {}
    for k, v in fields.items():
        if v is None:
            continue
        if k in _JSON_FIELDS or isinstance(v, (dict, list)):
            v = json.dumps(v, ensure_ascii=False)
        elif isinstance(v, bool):
            v = "1" if v else "0"
        out[k] = str(v)
    return out


def decode(raw: dict[bytes | str, bytes | str]) -> dict[str, Any]:
    """A job hash as typed Python values."""
    out: dict[str, Any] = {}
    for k, v in raw.items():
        k = k.decode() if isinstance(k, bytes) else k
        v = v.decode() if isinstance(v, bytes) else v
        if k in _JSON_FIELDS:
            v = json.loads(v)
        elif k in _FLOAT_FIELDS:
            v = float(v)
        elif k in _INT_FIELDS:
            v = int(v)
        elif k == "max_tokens_capped":
            v = v == "1"
        out[k] = v
    return out


class JobStore:
    """Job records of one Redis. Stateless apart from the client: share freely between threads."""

    def __init__(self, client: redis.Redis, *, ttl_s: int = settings.JOB_TTL_S.default,
                 worker_lost_grace_s: float = settings.WORKER_LOST_GRACE_S.default,
                 stream_maxlen: int = settings.STREAM_MAXLEN.default,
                 record_ttl_s: int = settings.RECORD_TTL_S.default,
                 output_ttl_s: int = settings.OUTPUT_TTL_S.default,
                 storage: StorageWatch | None = None):
        if not 0 < output_ttl_s <= record_ttl_s:
            # text without its record could never be read: GET answers 404 without a record
            raise ConfigError(f"{settings.OUTPUT_TTL_S.env}={output_ttl_s} must be > 0 and at most "
                              f"{settings.RECORD_TTL_S.env}={record_ttl_s}",
                              field=settings.OUTPUT_TTL_S.env)
        self.redis = client
        self.ttl_s = ttl_s
        self.record_ttl_s = record_ttl_s
        self.output_ttl_s = output_ttl_s
        self.stream_maxlen = stream_maxlen
        self.worker_lost_grace_s = worker_lost_grace_s
        #: whether Redis has room for new jobs (the API checks it before a submission)
        self.storage = storage or StorageWatch(client)
        self._create = lua.Script(client, "clock", "lane_counts", "fair_release", "create_job")
        self._transition = lua.Script(client, "clock", "fair_release", "transition_job")
        self._release_held = lua.Script(client, "clock", "fair_release", "release_held")

    @classmethod
    def from_settings(cls, client: redis.Redis, config: Mapping[str, Any] | None = None) -> JobStore:
        """The store the settings describe (the API passes its app config, keyed by env name)."""
        return cls(client, ttl_s=settings.JOB_TTL_S.get(config),
                   worker_lost_grace_s=settings.WORKER_LOST_GRACE_S.get(config),
                   stream_maxlen=settings.STREAM_MAXLEN.get(config),
                   record_ttl_s=settings.RECORD_TTL_S.get(config),
                   output_ttl_s=settings.OUTPUT_TTL_S.get(config),
                   storage=StorageWatch(client, settings.REDIS_HIGH_WATER.get(config)))

    def create(self, job_id: str, fields: dict[str, Any], queue_ttl_s: float,
               limits: BacklogLimits | None = None,
               message: tuple[str, str] | None = None, only_new: bool = False,
               fair: FairHold | None = None, offer: dict[str, Any] | None = None) -> float:
        """Store a new queued job and count its cost in its lane's backlog (tailguard.jobs.lane_load);
        returns submitted_at and sets expires_at (Redis clock). With `message` (a queue's
        list, its task message: tailguard.jobs.task_message), push the message too, in the same
        step.

        With `limits`, only while the lane is still within them, in the same atomic step:
        admission decided on the lane's load read a moment earlier, and a burst of requests
        on other API threads may each have seen the same empty lane. Past a limit nothing is
        stored and BacklogMoved says what the lane's figures are now. With `only_new`, a job
        that exists already is left as it is: JobStateConflict.

        With `fair` (and `message`), the lane dispatches in fair order by key: the message is
        held in its key's list and released onto the queue in counter order as slots free
        (tailguard/redis/lua/fair_release.lua), and past `limits` a key within its fair share
        is still admitted (AdmissionPolicy.admit_fairly's rule).

        With `offer` (tailguard.jobs.prefix_index.PrefixIndex.offer_args: `message`'s queue is a
        worker's own), the offer is recorded in the same step.
        """
        lane = fields["lane"]
        extra = {} if limits is None else {k: v for k, v in (
            ("slots", limits.slots), ("max_wait_tokens", limits.wait_tokens),
            ("max_backlog_after", limits.after)) if v is not None}
        if limits is not None and limits.sharing:
            extra["sharing"] = [keys.lane_running_key(l) for l in limits.sharing]
        script_keys = [keys.job_key(job_id), keys.lane_queued_key(lane),
                       keys.lane_backlog_key(lane), keys.lane_running_key(lane)]
        if message is not None:
            queue, extra["message"] = message
            script_keys.append(queue)
        if only_new:
            extra["only_new"] = True
        if offer is not None and message is not None and fair is None:
            extra["offer"] = offer
        if fair is not None and message is not None:
            extra["fair"] = {"patterns": keys.FAIR_KEY_PATTERNS, "lane": lane, "key": fair.key,
                             "weight": fair.weight}
        reply = self._create(
            script_keys, ttl_s=self.ttl_s, queue_ttl_s=queue_ttl_s, cost=int(fields.get("cost") or 0),
            fields=_encode(fields), **extra)
        if isinstance(reply, list):
            raise BacklogMoved(*(int(n) for n in reply))
        if reply in (b"exists", "exists"):
            raise JobStateConflict(f"job {job_id} exists already")
        return float(reply)

    def transition(self, job_id: str, from_states: set[str] | frozenset[str], to: str,
                   fields: dict[str, Any] | None = None, *, overdue_field: str = "",
                   overdue_grace_s: float = 0.0) -> tuple[bool, str | None]:
        """Atomically move a job from one of `from_states` to `to`.

        Returns (moved, state before the call); (False, None) when the job does not exist.
        With `overdue_field`, only moves when the Redis clock is past that field + grace.
        """
        fields = fields or {}
        extra: dict[str, Any] = {}
        if overdue_field:
            extra.update(overdue_field=overdue_field, grace_s=overdue_grace_s)
        if to in TERMINAL:
            extra.update(end_event=json.dumps(end_event_data(to, fields), ensure_ascii=False),
                         record_ttl_s=self.record_ttl_s, output_ttl_s=self.output_ttl_s)
            fields = without_text(fields)
        moved, state, _ = self._run_transition(job_id, from_states, to, fields, **extra)
        return moved, state

    def _run_transition(self, job_id: str, from_states: set[str] | frozenset[str], to: str,
                        fields: dict[str, Any], **extra: Any) -> tuple[bool, str | None, Any]:
        """transition_job.lua with its usual arguments plus `extra`: (moved, state, what the
        script returned third, or None)."""
        assert to in STATES
        reply = self._transition(
            [keys.job_key(job_id), keys.job_stream_key(job_id), keys.FINISHED_STREAM,
             keys.RUNNING_JOBS],
            **{"from": sorted(from_states), "to": to, "fields": _encode(fields),
               "stream_maxlen": self.stream_maxlen, "finished_maxlen": FINISHED_STREAM_MAXLEN,
               "lane_keys": _LANE_KEY_PATTERNS, "fair": keys.FAIR_KEY_PATTERNS,
               "worker_lost_grace_s": self.worker_lost_grace_s,
               **extra})
        state = reply[1]
        if isinstance(state, bytes):
            state = state.decode()
        return bool(reply[0]), state or None, reply[2] if len(reply) > 2 else None

    def start(self, job_id: str, worker: str) -> JobStart:
        """A worker starts a queued job: queued -> running with `worker`, unless its queue TTL
        has passed (`overdue`: the caller expires it) or it is no longer queued.

        One round trip on the path to the job's first token: the same step returns the record
        as it now is."""
        moved, state, extra = self._run_transition(job_id, {QUEUED}, RUNNING, {"worker": worker},
                                                   fresh_field="expires_at", return_record=True)
        if not moved:
            return JobStart(False, state, overdue=extra in (b"overdue", "overdue"))
        return JobStart(True, state, record=decode(dict(zip(extra[::2], extra[1::2]))))

    def held_work(self, lane: str) -> HeldWork:
        """A fair lane's held work, the keys' weights and counters, as admission reads them."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(keys.lane_held_tokens_key(lane))
        pipe.hgetall(keys.lane_weights_key(lane))
        pipe.hgetall(keys.lane_counters_key(lane))
        pipe.hgetall(keys.lane_running_tokens_key(lane))
        tokens, weights, counters, running = pipe.execute()
        return HeldWork({_text(k): int(v) for k, v in tokens.items()},
                        {_text(k): float(v) for k, v in weights.items()},
                        {_text(k): float(v) for k, v in counters.items()},
                        {_text(k): int(v) for k, v in running.items()})

    def held_jobs(self, lane: str) -> list[str]:
        """The ids of the jobs held on a fair lane, not yet released onto its queue."""
        return [keys.job_id_of(_text(e).split(" ", 2)[1])
                for entries in _per_held_list(self.redis, lane, "lrange", 0, -1) for e in entries]

    def held_count(self, lane: str) -> int:
        """How many jobs are held on a fair lane (without reading them)."""
        return held_count(self.redis, lane)

    def release_held(self, lane: str) -> int:
        """Release what fits of a fair lane's held jobs onto its queue now; how many."""
        return int(self._release_held([], fair=keys.FAIR_KEY_PATTERNS, lane=lane))

    def running(self) -> dict[str, str]:
        """Every running job's id -> the worker running it."""
        return {keys.job_id_of(k.decode() if isinstance(k, bytes) else k):
                w.decode() if isinstance(w, bytes) else w
                for k, w in self.redis.hgetall(keys.RUNNING_JOBS).items()}

    def unindex(self, job_id: str) -> None:
        """Drop a job whose record has expired from the running index (nothing else can)."""
        self.redis.hdel(keys.RUNNING_JOBS, keys.job_key(job_id))

    def status(self, job_id: str) -> str | None:
        """Just the state: what a running task polls to notice a cancel."""
        state = self.redis.hget(keys.job_key(job_id), "status")
        return state.decode() if state is not None else None

    def get(self, job_id: str) -> dict[str, Any] | None:
        raw = self.redis.hgetall(keys.job_key(job_id))
        return decode(raw) if raw else None

    def settle(self, job_id: str) -> dict[str, Any] | None:
        """Read a job, first ending it if it is overdue (see the module docstring)."""
        job = self.get(job_id)
        if job is None:
            return None
        if job["status"] == QUEUED and "expires_at" in job:
            moved, _ = self.transition(
                job_id, {QUEUED}, EXPIRED,
                {"error": JobExpired("the request waited in its lane's queue past queue_ttl_s")
                 .to_dict()},
                overdue_field="expires_at")
        elif job["status"] == RUNNING and "deadline_s" in job:
            moved, _ = self.transition(
                job_id, {RUNNING}, FAILED,
                {"error": WorkerLost("no result arrived within the lane deadline; "
                                     "the worker running it is gone").to_dict()},
                overdue_field="running_at",
                overdue_grace_s=job["deadline_s"] + self.worker_lost_grace_s)
        else:
            return job
        return self.get(job_id) if moved else job


@dataclasses.dataclass(frozen=True)
class FairHold:
    """A job's place in its lane's fair order: the API key it is charged to and the key's
    weight (tailguard/lanes/fair_share.py)."""

    key: str
    weight: float = 1.0


@dataclasses.dataclass(frozen=True)
class HeldWork:
    """A fair lane's held work (AdmissionPolicy.admit_fairly's figures): the cost tokens each
    API key has held on it, the keys' weights as their jobs carried them, their counters, and
    the cost tokens each key has running on it."""

    tokens: dict[str, int]
    weights: dict[str, float]
    counters: dict[str, float]
    running: dict[str, int] = dataclasses.field(default_factory=dict)


def held_count(client: redis.Redis, lane: str) -> int:
    """How many jobs are held in front of a fair lane's queue (tailguard/redis/lua/fair_release.lua)."""
    return sum(_per_held_list(client, lane, "llen"))


def _per_held_list(client: redis.Redis, lane: str, command: str, *args: Any) -> list[Any]:
    """`command` on each key's held list of a fair lane (the keys with jobs held), pipelined."""
    names = [_text(k) for k in client.hkeys(keys.lane_held_tokens_key(lane))]
    pipe = client.pipeline(transaction=False)
    for name in names:
        getattr(pipe, command)(keys.lane_held_key(lane, name), *args)
    return pipe.execute() if names else []


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclasses.dataclass(frozen=True)
class JobStart:
    """What JobStore.start did: `started` (and the record after it), or the state that
    stopped it; `overdue`: still queued, but past its queue TTL."""

    started: bool
    state: str | None
    overdue: bool = False
    record: dict[str, Any] = dataclasses.field(default_factory=dict)


class BacklogMoved(Exception):
    """The lane passed admission's limits between the decision and the store."""

    def __init__(self, backlog_tokens: int, queued_jobs: int, running_jobs: int,
                 sharing_jobs: int = 0) -> None:
        super().__init__(f"the lane now has {queued_jobs} jobs ({backlog_tokens} cost tokens) "
                         f"queued and {running_jobs} running (+{sharing_jobs} of the lanes "
                         "sharing its slots)")
        self.backlog_tokens, self.queued_jobs, self.running_jobs, self.sharing_jobs = (
            backlog_tokens, queued_jobs, running_jobs, sharing_jobs)

    def moved(self, load: LaneLoad) -> LaneLoad:
        """`load` with the lane's figures as the store found them."""
        return dataclasses.replace(load, backlog_tokens=self.backlog_tokens,
                                   queued_jobs=self.queued_jobs, running_jobs=self.running_jobs,
                                   sharing_jobs=self.sharing_jobs)


def without_text(fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` as the record stores them: a result without its text, which the job's stream
    holds (written there first, by the worker: tailguard/worker/runner.py)."""
    result = fields.get("result")
    if not isinstance(result, dict) or "text" not in result:
        return fields
    return {**fields, "result": {k: v for k, v in result.items() if k != "text"}}


def end_event_data(status: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The terminal stream event: how the job ended, without repeating the text."""
    data: dict[str, Any] = {"status": status}
    result = fields.get("result")
    if isinstance(result, dict):
        data.update({k: v for k, v in result.items() if k != "text"})
    if fields.get("error") is not None:
        data["error"] = fields["error"]
    return data


def timing(job: dict[str, Any]) -> dict[str, float | None]:
    """queued_s, ttft_s, e2e_s of a job, from the Redis-clock stamps and the engine's TTFT,
    and when it was submitted (Unix seconds, Redis clock)."""
    submitted, started = job.get("submitted_at"), job.get("running_at")
    ended = next((job[f"{s}_at"] for s in TERMINAL if f"{s}_at" in job), None)
    ttft = job.get("ttft_s")
    return {
        "queued_s": round(started - submitted, 6) if started and submitted else None,
        # time to first token as the client sees it: queue wait + engine TTFT
        "ttft_s": round(started - submitted + ttft, 6) if started and ttft is not None else None,
        "e2e_s": round(ended - submitted, 6) if ended and submitted else None,
        # the engine's own TTFT: from the worker calling generate() to the first token
        "engine_ttft_s": round(ttft, 6) if ttft is not None else None,
        "submitted_at": submitted,
    }
