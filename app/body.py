"""The JSON body of a POST, read once and checked: the one reader every view uses."""

from __future__ import annotations

from typing import Any

from flask import request
from werkzeug.exceptions import ClientDisconnected

from tailguard.errors import InvalidField, RequestTimeout, UnsupportedMediaType


def json_body() -> Any:
    """The decoded JSON body of this POST: 415 unless sent as application/json (a web page can
    send text/plain or a form cross-origin without a CORS preflight; never read those), 400
    unless it parses."""
    if not request.is_json:
        raise UnsupportedMediaType(
            f"send the body as application/json (got {request.mimetype or 'no content type'})",
            field="Content-Type")
    try:
        body = request.get_json(silent=True)
    except RecursionError:
        raise InvalidField("the body nests too deeply to be read", field="body") from None
    except (ClientDisconnected, OSError):
        # shorter than its Content-Length: the socket's read timed out
        # (TAILGUARD_API_READ_TIMEOUT_S, app/gunicorn_hooks.py) or the client left
        raise RequestTimeout("the client stopped sending its body before its Content-Length",
                             field="body") from None
    if body is None:
        raise InvalidField("the body must be valid JSON", field="body")
    _check_text(body)
    return body


def _check_text(body: Any) -> None:
    """InvalidField unless every string in `body` is valid Unicode: JSON may escape a lone
    surrogate (\\ud800), which no tokenizer, Redis or log can encode as UTF-8. Iterative: a
    deeply nested body must not exhaust the stack here either."""
    stack = [(body, "body")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, dict):
            for k, v in value.items():
                stack.append((k, where))
                stack.append((v, k if where == "body" else where))
        elif isinstance(value, list):
            stack.extend((v, where) for v in value)
        elif isinstance(value, str) and not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidField("the body holds a string that is not valid Unicode (a lone "
                                   "surrogate escape such as \\ud800)", field=where) from None
