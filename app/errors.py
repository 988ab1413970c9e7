"""The one place where errors become HTTP responses.

Every error body is JSON: {"error": {"code": <stable code>, "message": ..., "field"?: ...}}.
Codes and statuses come from the tailguard.errors tree; a Redis outage is a 503;
anything unexpected is logged here and answered with a 500 that carries no traceback.
"""

from __future__ import annotations

import logging

import redis
from flask import Flask, jsonify
from kombu.exceptions import OperationalError
from werkzeug.exceptions import HTTPException

from tailguard.errors import BodyTooLarge, BrokerUnavailable, TailguardError

log = logging.getLogger("tailguard.api")

_HTTP_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed",
               413: BodyTooLarge.code, 415: "unsupported_media_type"}


def error_response(status: int, code: str, message: str, field: str | None = None):
    body = {"code": code, "message": message}
    if field is not None:
        body["field"] = field
    return jsonify({"error": body}), status


def register(app: Flask) -> None:
    @app.errorhandler(TailguardError)
    def _tailguard(exc: TailguardError):
        if exc.http_status >= 500:
            log.error("%s: %s", exc.code, exc.message)
        return error_response(exc.http_status, exc.code, exc.message, exc.field)

    @app.errorhandler(redis.RedisError)
    @app.errorhandler(OperationalError)
    def _broker_down(exc: Exception):
        log.error("Redis unavailable: %s", exc)
        err = BrokerUnavailable("Redis (broker and job store) is not answering; retry later")
        return error_response(err.http_status, err.code, err.message)

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException):
        code = _HTTP_CODES.get(exc.code or 500, "http_error")
        return error_response(exc.code or 500, code, exc.description or exc.name)

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        log.exception("unhandled error")
        return error_response(500, "internal", "internal error; it has been logged")
