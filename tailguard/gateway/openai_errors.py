"""OpenAI's error shape for a member of the exception tree: what an OpenAI route answers, what
a failed OpenAI stream sends last, and what a batch's error line carries as its body."""

from __future__ import annotations

from tailguard.errors import TailguardError


def openai_error_type(status: int) -> str:
    """The OpenAI ``error.type`` for an HTTP status.

    OpenAI spells client errors "invalid_request_error", including an unknown
    model (404, code "model_not_found") and conflicts; it does not use vLLM's
    class-like names ("NotFoundError"). The openai client picks its exception
    class from the status alone, so the type is for humans and dashboards.
    """
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def error_body(message: str, *, type: str, param: str | None, code: str | int | None) -> dict:
    """``{"error": {message, type, param, code}}``, the OpenAI error shape."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def openai_error(err: TailguardError) -> dict:
    """The OpenAI error body of a tree member: also what a failed OpenAI stream sends last."""
    return error_body(err.message, type=openai_error_type(err.http_status), param=err.field,
                      code=err.code)
