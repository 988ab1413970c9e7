"""The one place where errors become HTTP responses.

Every error body is JSON. The native API answers
{"error": {"code": <stable code>, "message": ..., "field"?: ...}}; the OpenAI-compatible
routes answer OpenAI's shape {"error": {"message", "type", "param", "code"}} with the
same status and code. Codes and statuses come from the tailguard.errors tree; a Redis
outage is a 503; anything unexpected is logged here and answered with a 500 that
carries no traceback.
"""

from __future__ import annotations

import logging

import redis
from flask import Flask, jsonify, request
from kombu.exceptions import OperationalError
from werkzeug.exceptions import HTTPException

from tailguard.errors import BodyTooLarge, BrokerUnavailable, RequestError, TailguardError, Unavailable
from tailguard.openai_protocol import error_body, openai_error_type

#: blueprints whose clients speak the OpenAI API
OPENAI_BLUEPRINTS = frozenset({"openai"})

log = logging.getLogger("tailguard.api")

_HTTP_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed",
               413: BodyTooLarge.code, 415: "unsupported_media_type"}


def error_response(status: int, code: str, message: str, field: str | None = None):
    if request and (request.blueprint in OPENAI_BLUEPRINTS or request.path.startswith(
            ("/v1/completions", "/v1/chat/", "/v1/models"))):
        return jsonify(error_body(message, type=openai_error_type(status), param=field,
                                  code=code)), status
    body = {"code": code, "message": message}
    if field is not None:
        body["field"] = field
    return jsonify({"error": body}), status


def register(app: Flask) -> None:
    def count_rejected(code: str) -> None:
        gateway = app.extensions.get("tailguard")  # never build it here: Redis may be down
        if gateway is not None:
            gateway.metrics.rejected.labels(code).inc()

    @app.errorhandler(TailguardError)
    def _tailguard(exc: TailguardError):
        if exc.http_status >= 500:
            log.error("%s: %s", exc.code, exc.message)
        if isinstance(exc, (RequestError, Unavailable)):
            count_rejected(exc.code)
        return error_response(exc.http_status, exc.code, exc.message, exc.field)

    @app.errorhandler(redis.RedisError)
    @app.errorhandler(OperationalError)
    def _broker_down(exc: Exception):
        log.error("Redis unavailable: %s", exc)
        err = BrokerUnavailable("Redis (broker and job store) is not answering; retry later")
        count_rejected(err.code)
        return error_response(err.http_status, err.code, err.message)

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException):
        code = _HTTP_CODES.get(exc.code or 500, "http_error")
        if exc.code == 413:
            count_rejected(code)
        return error_response(exc.code or 500, code, exc.description or exc.name)

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        log.exception("unhandled error")
        return error_response(500, "internal", "internal error; it has been logged")
