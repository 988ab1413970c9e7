"""Names of Redis keys: built here and nowhere else."""

from __future__ import annotations

import re

PREFIX = "tailguard"
_JOB_ID_RE = re.compile(r"^[0-9a-f]{32}$")


def is_job_id(job_id: str) -> bool:
    """Job ids are uuid4 hex; anything else cannot be a job and never reaches Redis."""
    return bool(_JOB_ID_RE.match(job_id))


def job_key(job_id: str) -> str:
    """Hash holding one job's record, state and result."""
    if not is_job_id(job_id):
        raise ValueError(f"not a job id: {job_id!r}")
    return f"{PREFIX}:job:{job_id}"


def job_stream_key(job_id: str) -> str:
    """Redis Stream of one job's output: text deltas, then one terminal event."""
    return job_key(job_id) + ":stream"


def job_id_of(key: str) -> str:
    """The job id inside a job hash's key (the finished stream and the running index hold keys)."""
    return key.rsplit(":", 1)[-1]


def lane_workers_key(lane: str) -> str:
    """Sorted set of live workers serving `lane`, scored by when their heartbeat lapses."""
    return f"{PREFIX}:lane:{lane}:workers"






WORKERS = f"{PREFIX}:workers"
"""Sorted set of live worker processes, scored by when their heartbeat lapses: a worker is
in it while its process runs, engine up or not (the reaper reads it)."""

RUNNING_JOBS = f"{PREFIX}:running"
"""Hash of every running job: its job key -> the worker running it. Kept by the job
transition script in the same step as the state, so it never disagrees with the records."""

FINISHED_STREAM = f"{PREFIX}:finished"
"""Stream of every job that reached a terminal state (one entry each), for the gateway's
request log, metrics and stats. Consumed with a consumer group, so each entry is
handled once however many API processes run."""


REDELIVER_LEASE = f"{PREFIX}:redeliver:lease"
"""String: which process runs the redelivery passes now (tailguard/jobs/redeliver.py), until
its lease lapses."""


def stats_key(minute: int, lane: str) -> str:
    """Hash of one lane's mergeable latency/length histograms for one minute (epoch // 60)."""
    return f"{PREFIX}:stats:{minute}:{lane}"


def key_stats_key(minute: int, name: str) -> str:
    """Hash of one API key's histograms for one minute (as stats_key's), with the output tokens
    it was served per lane (``served:{lane}``) and its refusals."""
    return f"{PREFIX}:keystats:{minute}:{name}"


def key_stats_names_key(minute: int) -> str:
    """Set of the API key names with a key_stats_key hash in that minute."""
    return f"{PREFIX}:keystats:{minute}"


def slow_key(minute: int) -> str:
    """Sorted set of that minute's slowest requests, scored by e2e latency."""
    return f"{PREFIX}:slow:{minute}"


def lane_queued_key(lane: str) -> str:
    """Sorted set of a lane's queued jobs, member ``<cost> <job key>``, scored by expires_at."""
    return f"{PREFIX}:lane:{lane}:queued"


def lane_backlog_key(lane: str) -> str:
    """Integer: the cost tokens of the members of ``lane_queued_key`` (admission's backlog)."""
    return f"{PREFIX}:lane:{lane}:backlog"


def lane_running_key(lane: str) -> str:
    """Sorted set of a lane's jobs running on its own workers (admission's slots in use), member
    the job key, scored by when the API would settle the job as worker_lost."""
    return f"{PREFIX}:lane:{lane}:running"


def lane_fair_key(lane: str) -> str:
    """Hash of a lane that dispatches in fair order by key (tailguard/lanes/fair_share.py):
    ``queue`` (its Celery list), ``slots`` (its batch slots as admission last counted them),
    ``last_served`` (the key released last)."""
    return f"{PREFIX}:lane:{lane}:fair"


def lane_held_key(lane: str, key: str) -> str:
    """List of one API key's jobs held in front of a fair lane's Celery list, oldest first:
    entries ``<cost> <job key> <task message>``."""
    return f"{PREFIX}:lane:{lane}:held:{key}"


def lane_held_tokens_key(lane: str) -> str:
    """Hash: API key -> the cost tokens of its jobs held on the lane (a field per key with jobs
    held: the keys backlogged in fair order)."""
    return f"{PREFIX}:lane:{lane}:held-tokens"


def lane_running_tokens_key(lane: str) -> str:
    """Hash: API key -> the cost tokens of its jobs running on a fair lane (fair admission's
    share counts what a key runs as well as what it has held)."""
    return f"{PREFIX}:lane:{lane}:running-tokens"


def lane_counters_key(lane: str) -> str:
    """Hash: API key -> its virtual token counter on the lane (cost tokens released / weight)."""
    return f"{PREFIX}:lane:{lane}:counters"


def lane_weights_key(lane: str) -> str:
    """Hash: API key -> its weight, as its latest job on the lane carried it."""
    return f"{PREFIX}:lane:{lane}:weights"


#: the fair-order keys of a lane as the Lua steps build them (%s: the lane; held: then the key)
FAIR_KEY_PATTERNS = {"fair": lane_fair_key("%s"), "held": lane_held_key("%s", "%s"),
                     "tokens": lane_held_tokens_key("%s"), "counters": lane_counters_key("%s"),
                     "weights": lane_weights_key("%s"), "running": lane_running_key("%s"),
                     "running_tokens": lane_running_tokens_key("%s")}


def lane_worker_slots_key(lane: str) -> str:
    """Hash of the live workers serving `lane`: worker -> its per-engine limit for the lane
    (``Lane.engine_slots``, cut on the front end's engine), written with its heartbeat."""
    return f"{PREFIX}:lane:{lane}:worker-slots"


def lane_served_key(lane: str) -> str:
    """Hash of cost tokens served per second (field: the Redis-clock second) over the rate window."""
    return f"{PREFIX}:lane:{lane}:served"


def lane_served_ms_key(lane: str) -> str:
    """Hash of the engine milliseconds those requests ran (field: the second they finished)."""
    return f"{PREFIX}:lane:{lane}:served-ms"


# -- prefix affinity (tailguard/jobs/prefix_index.py) ---------------------------------------

def prefix_holders_key(prefix: str) -> str:
    """Sorted set of the workers that served a prompt prefix (a block hash:
    tailguard/lanes/affinity.py) lately, scored by when; the latest few kept, expiring unused."""
    if not re.fullmatch(r"[0-9a-f]{8,64}", prefix):
        raise ValueError(f"not a prefix hash: {prefix!r}")
    return f"{PREFIX}:prefix:{prefix}"


def worker_queue(queue: str, worker: str) -> str:
    """The Celery queue (a Redis list) of a lane's jobs offered to one worker first."""
    if not worker or any(c.isspace() for c in worker):
        raise ValueError(f"not a worker name: {worker!r}")
    return f"{queue}.w.{worker}"


OFFERS = f"{PREFIX}:offers"
"""Sorted set of the jobs offered to one worker first, scored by when the offer lapses (Redis
clock): then the job moves to its lane's queue."""

OFFER_MESSAGES = f"{PREFIX}:offers:messages"
"""Hash: job id -> JSON [worker, its queue, the lane's queue, the task message] of an offer."""

OFFERED = f"{PREFIX}:offers:per-worker"
"""Hash: worker -> how many jobs are offered to it now (its load beside what it runs)."""

OFFER_OUTCOMES = f"{PREFIX}:offers:outcomes"
"""Hash: outcome (made, taken, given_up) -> offers so, since Redis started (a counter)."""

#: the offer keys as the Lua steps take them
OFFER_KEYS = {"offers": OFFERS, "messages": OFFER_MESSAGES, "offered": OFFERED,
              "outcomes": OFFER_OUTCOMES}


API_KEYS = f"{PREFIX}:apikeys"
"""Hash of API keys: sha256 hex of the key -> its record (JSON). Keys are never stored."""

API_AUTH_MODE = f"{PREFIX}:api:auth"
"""String: the authentication mode (open or keys) of the API process that started last, written
as it starts: `tailguard keys add` reads it to say when a new key is asked for by nothing."""


def api_key_bucket_key(digest: str) -> str:
    """Hash of one API key's token buckets (requests, tokens): level and when last filled."""
    return f"{PREFIX}:apikey:{digest}:bucket"


# -- the Batch API (tailguard/batches/) ---------------------------------------------------

_FILE_ID_RE = re.compile(r"^file-[0-9a-f]{32}$")
_BATCH_ID_RE = re.compile(r"^batch_[0-9a-f]{32}$")


def is_file_id(file_id: str) -> bool:
    """Batch API file ids are ``file-`` + 32 hex; anything else never reaches Redis."""
    return bool(_FILE_ID_RE.match(file_id))


def is_batch_id(batch_id: str) -> bool:
    """Batch ids are ``batch_`` + 32 hex; anything else never reaches Redis."""
    return bool(_BATCH_ID_RE.match(batch_id))


def file_key(file_id: str) -> str:
    """Hash of one Batch API file's metadata (its contents are in the batch storage)."""
    if not is_file_id(file_id):
        raise ValueError(f"not a file id: {file_id!r}")
    return f"{PREFIX}:file:{file_id}"


def files_key(owner: str | None) -> str:
    """Sorted set of the files of one API key (None: every file), scored by when each was
    made (Redis clock, microseconds)."""
    return f"{PREFIX}:files" + ("" if owner is None else f":of:{owner}")


def files_bytes_key(owner: str | None) -> str:
    """Integer: the bytes of the Batch API files of one API key (None: of every file)."""
    return f"{PREFIX}:files:bytes" + ("" if owner is None else f":of:{owner}")

FILES_EXPIRING = f"{PREFIX}:files:expiring"
"""Sorted set of files that expire (batch outputs), scored by expires_at: the feeder deletes them."""


def batch_key(batch_id: str) -> str:
    """Hash of one batch: its public fields, its owner and the feeder's cursor."""
    if not is_batch_id(batch_id):
        raise ValueError(f"not a batch id: {batch_id!r}")
    return f"{PREFIX}:batch:{batch_id}"


def batch_lines_key(batch_id: str, part: str) -> str:
    """A batch's line state while it runs: ``pending`` (hash: line index -> its attempt, queued
    or running), ``retry`` (set of line indices to queue again), ``output`` and ``errors``
    (hashes: line index -> its output or error file line)."""
    if part not in ("pending", "retry", "output", "errors"):
        raise ValueError(f"not a batch line state: {part!r}")
    return batch_key(batch_id) + ":" + part


def batches_key(owner: str | None) -> str:
    """Sorted set of the batches of one API key (None: every batch), scored by when each was
    made (Redis clock, microseconds)."""
    return f"{PREFIX}:batches" + ("" if owner is None else f":of:{owner}")


BATCHES_ACTIVE = f"{PREFIX}:batches:active"
"""Set of the batches not yet ended: what the feeder works through, level-triggered."""

BATCHES_ENDED = f"{PREFIX}:batches:ended"
"""Hash: end status (completed, failed, expired, cancelled) -> batches that ended so."""

BATCH_FEEDER_LEASE = f"{PREFIX}:batches:feeder:lease"
"""String: which API process runs the batch feeder now, until its lease lapses."""
