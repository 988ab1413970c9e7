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

The API settles overdue jobs when it reads them (queued past its queue TTL ->
expired, running far past its deadline -> failed/worker_lost), so no accepted
request can stay "queued" or "running" forever even if every worker is gone.
"""

from __future__ import annotations

import json
from typing import Any

import redis

from tailguard import keys

QUEUED, RUNNING = "queued", "running"
SUCCEEDED, FAILED, EXPIRED, CANCELLED = "succeeded", "failed", "expired", "cancelled"
TERMINAL = frozenset({SUCCEEDED, FAILED, EXPIRED, CANCELLED})
STATES = frozenset({QUEUED, RUNNING}) | TERMINAL

_NOW_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
"""

# KEYS[1] job key; ARGV: record ttl_s, queue ttl_s, field, value, ...  -> submitted_at
_CREATE = _NOW_LUA + """
redis.call('HSET', KEYS[1], 'status', 'queued', 'submitted_at', string.format('%.6f', now),
           'expires_at', string.format('%.6f', now + tonumber(ARGV[2])))
for i = 3, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[1]))
return string.format('%.6f', now)
"""

# KEYS[1] job key; KEYS[2] its stream; KEYS[3] the stream of finished jobs
# ARGV[1] allowed from-states, comma separated; ARGV[2] new state
# ARGV[3] overdue field ('' = none): only move if now > tonumber(field) + ARGV[4]
# ARGV[5] terminal event data ('' = none), appended to the stream in the same step
# ARGV[6] stream maxlen; ARGV[7..] field, value pairs to set
# -> {1, previous} when moved; {0, current} when not (current false if no such job)
_TRANSITION = _NOW_LUA + """
local cur = redis.call('HGET', KEYS[1], 'status')
if not cur then return {0, false} end
local allowed = false
for s in string.gmatch(ARGV[1], '[^,]+') do if s == cur then allowed = true end end
if not allowed then return {0, cur} end
if ARGV[3] ~= '' then
  local since = tonumber(redis.call('HGET', KEYS[1], ARGV[3]))
  if not since or now <= since + tonumber(ARGV[4]) then return {0, cur} end
end
redis.call('HSET', KEYS[1], 'status', ARGV[2], ARGV[2] .. '_at', string.format('%.6f', now))
for i = 7, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
if ARGV[5] ~= '' then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[6], '*', 'type', 'end', 'data', ARGV[5])
  local ttl = redis.call('TTL', KEYS[1])
  if ttl > 0 then redis.call('EXPIRE', KEYS[2], ttl) end
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', '100000', '*', 'key', KEYS[1])
end
return {1, cur}
"""

# fields stored as JSON (the rest are strings or numbers)
_JSON_FIELDS = ("result", "error", "sampling", "timing")
_FLOAT_FIELDS = ("submitted_at", "expires_at", "deadline_s", "queued_at", "running_at",
                 "succeeded_at", "failed_at", "expired_at", "cancelled_at", "ttft_s")
_INT_FIELDS = ("prompt_tokens", "max_tokens", "requested_max_tokens", "completion_tokens", "cost",
               "engine_prompt_tokens")


def _encode(fields: dict[str, Any]) -> list[str]:
    flat: list[str] = []
    for k, v in fields.items():
        if v is None:
            continue
        if k in _JSON_FIELDS or isinstance(v, (dict, list)):
            v = json.dumps(v, ensure_ascii=False)
        elif isinstance(v, bool):
            v = "1" if v else "0"
        flat += [k, str(v)]
    return flat


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

    def __init__(self, client: redis.Redis, *, ttl_s: int = 86400, worker_lost_grace_s: float = 30.0,
                 stream_maxlen: int = 10000):
        self.redis = client
        self.ttl_s = ttl_s
        self.stream_maxlen = stream_maxlen
        self.worker_lost_grace_s = worker_lost_grace_s
        self._create = client.register_script(_CREATE)
        self._transition = client.register_script(_TRANSITION)

    def create(self, job_id: str, fields: dict[str, Any], queue_ttl_s: float) -> float:
        """Store a new queued job; returns submitted_at and sets expires_at (Redis clock)."""
        return float(self._create(keys=[keys.job_key(job_id)],
                                  args=[self.ttl_s, queue_ttl_s, *_encode(fields)]))

    def transition(self, job_id: str, from_states: set[str] | frozenset[str], to: str,
                   fields: dict[str, Any] | None = None, *, overdue_field: str = "",
                   overdue_grace_s: float = 0.0) -> tuple[bool, str | None]:
        """Atomically move a job from one of `from_states` to `to`.

        Returns (moved, state before the call); (False, None) when the job does not exist.
        With `overdue_field`, only moves when the Redis clock is past that field + grace.
        """
        assert to in STATES
        fields = fields or {}
        end_event = json.dumps(end_event_data(to, fields), ensure_ascii=False) if to in TERMINAL else ""
        moved, state = self._transition(
            keys=[keys.job_key(job_id), keys.job_stream_key(job_id), keys.FINISHED_STREAM],
            args=[",".join(sorted(from_states)), to, overdue_field, overdue_grace_s, end_event,
                  self.stream_maxlen, *_encode(fields)])
        if isinstance(state, bytes):
            state = state.decode()
        return bool(moved), state or None

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
                {"error": {"code": "expired",
                           "message": "the request waited in its lane's queue past queue_ttl_s"}},
                overdue_field="expires_at")
        elif job["status"] == RUNNING and "deadline_s" in job:
            moved, _ = self.transition(
                job_id, {RUNNING}, FAILED,
                {"error": {"code": "worker_lost",
                           "message": "no result arrived within the lane deadline; "
                                      "the worker running it is gone"}},
                overdue_field="running_at",
                overdue_grace_s=job["deadline_s"] + self.worker_lost_grace_s)
        else:
            return job
        return self.get(job_id) if moved else job


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
    """queued_s, ttft_s, e2e_s of a job, from the Redis-clock stamps and the engine's TTFT."""
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
    }
