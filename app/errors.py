"""The one place where errors become HTTP responses.

Every error body is JSON. The native API answers
{"error": {"code": <stable code>, "message": ..., "field"?: ...}}; the OpenAI-compatible
routes answer OpenAI's shape {"error": {"message", "type", "param", "code"}} with the
same status and code (tailguard/gateway/openai_errors.py). Codes and statuses come from
the tailguard.errors tree, a job that did not succeed included (``job_error`` in
tailguard/gateway/service.py); a Redis outage is a 503 with
Retry-After (every Redis call is bounded by TAILGUARD_REDIS_SOCKET_TIMEOUT_S); anything
unexpected is logged here and answered with a 500 that carries no traceback.
"""

from __future__ import annotations

import logging

import redis
from flask import Flask, Response, jsonify, request
from kombu.exceptions import OperationalError
from werkzeug.exceptions import HTTPException

from app.gateway_ext import built_gateway
from tailguard.errors import (
    BodyTooLarge,
    BrokerUnavailable,
    JobNotFound,
    Refused,
    RequestError,
    StorageFull,
    TailguardError,
    Unauthenticated,
    Unavailable,
    UnsupportedMediaType,
)
from tailguard.gateway.openai_errors import error_body, openai_error_type
from tailguard.redis.client import out_of_memory

#: blueprints whose clients speak the OpenAI API (vLLM's server routes outside /v1 too)
OPENAI_BLUEPRINTS = frozenset({"openai", "vllm", "batches"})
#: their paths, for errors raised before a route matched (an unknown method, a 404)
OPENAI_PATH_PREFIXES = ("/v1/completions", "/v1/chat/", "/v1/models", "/v1/responses",
                        "/v1/files", "/v1/batches")
VLLM_PATHS = frozenset({"/health", "/version", "/tokenize", "/detokenize"})


def speaks_openai(path: str, blueprint: str | None = None) -> bool:
    """Whether the client of this path (or blueprint) speaks the OpenAI API."""
    return blueprint in OPENAI_BLUEPRINTS or path.startswith(OPENAI_PATH_PREFIXES) or path in VLLM_PATHS


log = logging.getLogger("tailguard.api")

#: codes of the HTTP errors Flask raises itself (unknown route, wrong method, ...)
HTTP_CODES = {400: RequestError.code, 404: JobNotFound.code, 405: "method_not_allowed",
               413: BodyTooLarge.code, 415: UnsupportedMediaType.code}


def error_response(status: int, code: str, message: str, field: str | None = None, *,
                   headers: dict[str, str] | None = None) -> Response:
    """The error answer to this request, in the shape its API speaks."""
    if request and speaks_openai(request.path, request.blueprint):
        body = error_body(message, type=openai_error_type(status), param=field, code=code)
    else:
        body = {"error": {"code": code, "message": message, **({} if field is None else {"field": field})}}
    resp = jsonify(body)
    resp.status_code = status
    resp.headers.update(headers or {})
    return resp


def exception_response(err: TailguardError, *, headers: dict[str, str] | None = None) -> Response:
    """error_response for a member of the tree: its status, code, message and field; a refusal
    or an unavailable dependency says when to come back (Retry-After, which OpenAI clients
    honour); a 401 how to authenticate."""
    headers = dict(headers or {})
    if isinstance(err, (Refused, Unavailable)):
        headers["Retry-After"] = str(err.retry_after_s)
    if isinstance(err, Unauthenticated):
        headers["WWW-Authenticate"] = "Bearer"
    return error_response(err.http_status, err.code, err.message, err.field, headers=headers)


def register(app: Flask) -> None:
    def count_rejected(code: str) -> None:
        gateway = built_gateway(app)  # never build it here: Redis may be down
        if gateway is not None:
            gateway.metrics.rejected.labels(code).inc()

    @app.errorhandler(TailguardError)
    def _tailguard(exc: TailguardError):
        if exc.http_status >= 500:
            # a 503 by design (storage full, no live worker) is the system saying "later", not a fault
            (log.warning if isinstance(exc, Unavailable) else log.error)("%s: %s", exc.code,
                                                                         exc.message)
        if isinstance(exc, (RequestError, Unavailable)):
            count_rejected(exc.code)
        return exception_response(exc)

    @app.errorhandler(redis.RedisError)
    @app.errorhandler(OperationalError)
    def _broker_down(exc: Exception):
        if out_of_memory(exc):  # past maxmemory, which the high-water mark should have spared
            log.error("Redis is full: %s", exc)
            err: Unavailable = StorageFull("Redis is full (maxmemory); retry later")
        else:
            log.error("Redis unavailable: %s", exc)
            err = BrokerUnavailable("Redis (broker and job store) is not answering; retry later")
        count_rejected(err.code)
        return exception_response(err)

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException):
        code = HTTP_CODES.get(exc.code or 500, "http_error")
        if exc.code == 413:
            count_rejected(code)
        return error_response(exc.code or 500, code, exc.description or exc.name)

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        log.exception("unhandled error")
        return error_response(500, TailguardError.code, "internal error; it has been logged")
