"""The one exception tree of tailguard.

Every error the product raises on purpose is a ``TailguardError``. The API maps
each class to an HTTP status and a stable machine-readable ``code`` in exactly
one place (``app/errors.py``); workers map them to a terminal job state.

::

    TailguardError                      code              HTTP
    ├── ConfigError                     config_error      500 (startup only: never reaches a client)
    ├── RequestError                    bad_request       400  the caller sent something we will not run
    │   ├── InvalidField                invalid_field     400  a field has the wrong type or value
    │   ├── PromptTooLong               prompt_too_long   400  prompt does not fit any lane's context
    │   ├── NoLaneForRequest            no_lane           400  no lane accepts this priority/cost
    │   └── BodyTooLarge                body_too_large    413
    ├── JobNotFound                     not_found         404  unknown (or expired-from-storage) id
    │   └── ModelNotFound               model_not_found   404  `model` names a model we do not serve
    ├── JobStateConflict                conflict          409  e.g. cancelling a finished job
    ├── Unavailable                     unavailable       503  recoverable: retry later
    │   └── BrokerUnavailable           broker_unavailable 503 Redis does not answer
    └── EngineError                     engine_error      (worker side) one request failed; job -> failed
        └── EngineDeadError             engine_dead       (worker side) the engine is gone; fatal for the worker

``RequestError`` and ``Unavailable`` are recoverable by the caller (fix the request,
retry later); ``EngineDeadError`` is fatal for the worker process that raised it.
"""

from __future__ import annotations


class TailguardError(Exception):
    """Root of every error tailguard raises on purpose."""

    code = "internal"
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


class BodyTooLarge(RequestError):
    code = "body_too_large"
    http_status = 413


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
    """A dependency is down; the same request may succeed later."""

    code = "unavailable"
    http_status = 503


class BrokerUnavailable(Unavailable):
    code = "broker_unavailable"


class EngineError(TailguardError):
    """One generation failed; the worker and its engine carry on."""

    code = "engine_error"


class EngineDeadError(EngineError):
    """The engine process is gone; the worker cannot serve anything more."""

    code = "engine_dead"


class JobError(TailguardError):
    """Why a job ended without a result: the code is recorded in the job record."""

    code = "job_error"


class JobExpired(JobError):
    code = "expired"


class JobCancelled(JobError):
    code = "cancelled"


class WorkerLost(JobError):
    code = "worker_lost"


class InternalJobError(JobError):
    code = "internal_error"
