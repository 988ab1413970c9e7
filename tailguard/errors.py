"""The one exception tree of tailguard.

Every error the product raises on purpose is a ``TailguardError``. The API maps
each class to an HTTP status and a stable machine-readable ``code`` in exactly
one place (``app/errors.py``); workers map them to a terminal job state.

::

    TailguardError                      code                   HTTP
    ├── ConfigError                     config_error           500 (startup only: never reaches a client)
    ├── RequestError                    bad_request            400  the caller sent something we will not run
    │   ├── InvalidField                invalid_field          400  a field has the wrong type or value
    │   ├── PromptTooLong               prompt_too_long        400  prompt does not fit any lane's context
    │   ├── NoLaneForRequest            no_lane                400  no lane accepts this priority/cost
    │   ├── OverKeyLimit                over_key_limit         400  costs more than the key's whole tokens/min
    │   ├── RequestTimeout              request_timeout        408  the client stalled sending its request
    │   ├── BodyTooLarge                body_too_large         413
    │   └── UnsupportedMediaType        unsupported_media_type 415  a POST body that is not JSON
    ├── Unauthenticated                 invalid_api_key        401  no API key, or not a known one
    ├── Refused                         refused                429  not now: come back after Retry-After
    │   ├── LaneFull                    lane_full              429  the lane's backlog is at its bound
    │   ├── WaitTooLong                 wait_too_long          429  predicted wait > what the lane promises
    │   ├── OverFairShare               over_fair_share        429  lane full, the key over its share of it
    │   ├── WaitPastTarget              wait_past_target       429  predicted wait > the request's TTFT target
    │   ├── RateLimited                 rate_limited           429  the API key's per-minute limit
    │   ├── TooManyWaits                too_many_waits         429  the key holds its most waits/streams open
    │   └── QuotaExceeded               quota_exceeded         429  the key's Batch API files or batches
    ├── JobNotFound                     not_found              404  unknown (or expired-from-storage) id
    │   └── ModelNotFound               model_not_found        404  `model` names a model we do not serve
    ├── JobStateConflict                conflict               409  e.g. cancelling a finished job
    ├── Unavailable                     unavailable            503  recoverable: retry later
    │   ├── BrokerUnavailable           broker_unavailable     503  Redis does not answer
    │   ├── NoLiveWorker                no_live_worker         503  no worker serves the lane now
    │   └── StorageFull                 storage_full           503  Redis past its high-water mark
    ├── ResultTimeout                   timeout                504  a waiting call gave up; the job goes on
    ├── EngineError                     engine_error           500  one request failed; job -> failed
    │   ├── EngineDeadError             engine_dead            500  the engine is gone; the worker restarts it
    │   └── EngineRefused               engine_refused         400  vLLM's serving layer refused it
    └── JobError                        job_error              500  why a job ended without a result:
        ├── JobExpired                  expired                503  waited in its queue past queue_ttl_s
        ├── JobCancelled                cancelled              400  DELETE, or the client went away
        ├── WorkerLost                  worker_lost            500  its worker stopped heart-beating
        ├── PoisonRequest               poison_request         422  in flight during two engine deaths
        ├── InternalJobError            internal_error         500  a bug in the task (the root's code too)
        └── MessageLost                 message_lost           503  its message was lost in a broker outage

The root's code, ``internal_error``, is what any unexpected exception is
answered with. ``RequestError``, ``Refused`` and ``Unavailable`` are recoverable
by the caller (fix the request, retry after ``Retry-After``, retry later);
``EngineDeadError`` is fatal for the
engine that raised it (the worker restarts its engine). ``PoisonRequest`` is a
4xx on purpose: clients (the openai library among them) retry 5xx answers on
their own, and a request that took two engines down must not be sent again. So is
``JobCancelled`` (400, what vLLM answers an aborted request): a client waiting for a job
someone cancelled must not send it again either (the SDKs retry 409 too).

A job that ends without a result keeps ``{"code", "message"}`` of one of the
classes from ``EngineError`` down in its record (``to_dict``); ``error_class``
turns the code back into its class, and with it its HTTP status.
"""

from __future__ import annotations


class TailguardError(Exception):
    """Root of every error tailguard raises on purpose."""

    code = "internal_error"
    http_status = 500

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        #: the request field (or config field) the error is about, if any
        self.field = field

    def to_dict(self) -> dict:
        body = {"code": self.code, "message": self.message}
        if self.field is not None:
            body["field"] = self.field
        return body


class ConfigError(TailguardError):
    """A settings value or the lanes file is invalid; raised at startup."""

    code = "config_error"


class RequestError(TailguardError):
    """The caller sent a request we will not run."""

    code = "bad_request"
    http_status = 400


class InvalidField(RequestError):
    code = "invalid_field"


class PromptTooLong(RequestError):
    code = "prompt_too_long"


class NoLaneForRequest(RequestError):
    code = "no_lane"


class OverKeyLimit(RequestError):
    """A submission whose cost exceeds its key's whole tokens per minute: no wait makes room for
    it, so it is a 400 (clients retry a 429), not a rate limit."""

    code = "over_key_limit"


class RequestTimeout(RequestError):
    """The client sent nothing for TAILGUARD_API_READ_TIMEOUT_S while its request was read."""

    code = "request_timeout"
    http_status = 408


class BodyTooLarge(RequestError):
    code = "body_too_large"
    http_status = 413


class UnsupportedMediaType(RequestError):
    """A POST body not sent as application/json: a plain form or text/plain (which a web page
    may send cross-origin without a CORS preflight) is never read."""

    code = "unsupported_media_type"
    http_status = 415


class Unauthenticated(TailguardError):
    """No API key, or one we do not know (OpenAI's code for it)."""

    code = "invalid_api_key"
    http_status = 401


class Refused(TailguardError):
    """Not run now, and not queued to expire either: the caller may retry after ``retry_after_s``
    (sent as ``Retry-After``)."""

    code = "refused"
    http_status = 429

    def __init__(self, message: str, *, field: str | None = None, retry_after_s: int = 1,
                 lane: str | None = None) -> None:
        super().__init__(message, field=field)
        self.retry_after_s = max(1, int(retry_after_s))
        #: the lane that refused (None: refused before placement, e.g. a key's rate limit)
        self.lane = lane


class LaneFull(Refused):
    code = "lane_full"


class WaitTooLong(Refused):
    code = "wait_too_long"


class OverFairShare(Refused):
    """The lane must refuse, and the key holds more than its weighted share of what the lane may
    hold (tailguard/lanes/fair_share.py): it is refused before the keys within theirs."""

    code = "over_fair_share"


class WaitPastTarget(Refused):
    """The lane's predicted wait already misses the request's time-to-first-token target
    (tailguard/lanes/latency_targets.py): refused at once rather than queued to miss it."""

    code = "wait_past_target"


class RateLimited(Refused):
    code = "rate_limited"


class TooManyWaits(Refused):
    """The key already holds TAILGUARD_MAX_WAITS_PER_KEY long-polls, streams and waiting OpenAI
    calls open in this API process: each holds an API thread."""

    code = "too_many_waits"


class QuotaExceeded(Refused):
    """The key stores as many Batch API file bytes (TAILGUARD_BATCH_MAX_BYTES_PER_KEY) or runs as
    many batches (TAILGUARD_BATCH_MAX_RUNNING_PER_KEY) as it may: room comes back as its batches
    end and its files are deleted or expire."""

    code = "quota_exceeded"


class JobNotFound(TailguardError):
    code = "not_found"
    http_status = 404


class ModelNotFound(JobNotFound):
    """The body names a model this deployment does not serve (404, as OpenAI and vLLM answer)."""

    code = "model_not_found"


class JobStateConflict(TailguardError):
    code = "conflict"
    http_status = 409


class Unavailable(TailguardError):
    """A dependency is down; the same request may succeed later (after ``retry_after_s``,
    sent as ``Retry-After``)."""

    code = "unavailable"
    http_status = 503
    retry_after_s = 2  # a restarted Redis replays its AOF and clients reconnect within seconds


class BrokerUnavailable(Unavailable):
    code = "broker_unavailable"


class NoLiveWorker(Unavailable):
    """No worker has advertised the lane lately: accepting would only let the request expire."""

    code = "no_live_worker"
    retry_after_s = 5  # a few heartbeats: a restarted worker or engine advertises again


class StorageFull(Unavailable):
    """Redis holds more than TAILGUARD_REDIS_HIGH_WATER of its maxmemory: no new job until
    finished ones expire, so the jobs already accepted finish and heartbeats keep writing in
    the room left (tailguard/jobs/redis_memory.py)."""

    code = "storage_full"
    retry_after_s = 10  # records expire continuously: room comes back within seconds under load


class ResultTimeout(TailguardError):
    """A caller waiting for a job's result gave up before the job ended (it still may)."""

    code = "timeout"
    http_status = 504


class EngineError(TailguardError):
    """One generation failed; the worker and its engine carry on."""

    code = "engine_error"


class EngineDeadError(EngineError):
    """The engine process is gone: the requests in it fail, and the worker restarts its engine."""

    code = "engine_dead"


class EngineRefused(EngineError):
    """vLLM's OpenAI serving layer on the worker refused the request (e.g. a grammar that does
    not compile), with vLLM's message and param: a 400, since the same request fails again
    however often it is sent (the API's own render refuses nearly everything before queueing)."""

    code = "engine_refused"
    http_status = 400


class JobError(TailguardError):
    """Why a job ended without a result: the code is recorded in the job record."""

    code = "job_error"


class JobExpired(JobError):
    """It waited in its lane's queue past queue_ttl_s: 503, the lane is backed up."""

    code = "expired"
    http_status = 503


class JobCancelled(JobError):
    code = "cancelled"
    http_status = 400


class WorkerLost(JobError):
    code = "worker_lost"


class PoisonRequest(JobError):
    """The request was in flight when the engine died, twice: it is quarantined, never run again."""

    code = "poison_request"
    http_status = 422


class InternalJobError(JobError):
    code = "internal_error"


class MessageLost(JobError):
    """The broker took the job's message, but it was lost in a Redis outage before any worker
    started it (tailguard/jobs/redeliver.py): nothing ran, and the client may resubmit."""

    code = "message_lost"
    http_status = 503


def error_class(code: str | None) -> type[TailguardError] | None:
    """The class of the tree (below the root) whose code this is; None for an unknown code."""
    return _BY_CODE.get(code) if code is not None else None


def error_classes(cls: type[TailguardError] = TailguardError) -> list[type[TailguardError]]:
    """Every class of the tree below ``cls``, depth first (what the API can answer with)."""
    return [c for sub in cls.__subclasses__() for c in (sub, *error_classes(sub))]


#: code -> class; the codes below the root are unique (tests/unit/test_errors.py)
_BY_CODE: dict[str, type[TailguardError]] = {c.code: c for c in error_classes()}
