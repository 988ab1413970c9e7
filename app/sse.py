"""Server-Sent Events over WSGI, with disconnect detection: the framing of every stream.

A WSGI app learns that a client went away only when a write fails: the server
(gunicorn) then closes our response iterator, which raises GeneratorExit at the
`yield`. Heartbeat comments during silence make that write happen.
"""

from __future__ import annotations

import json
import select
import socket
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from flask import Response, request


def sse_event(data: Any, *, event: str | None = None, id: str | None = None) -> bytes:
    """One event, for native and OpenAI streams alike: ``data:`` is compact JSON, or a raw string.

    JSON escapes newlines inside strings, so a JSON event is one ``data:`` line
    (the shape OpenAI clients parse); a raw string (OpenAI's ``[DONE]``) goes as is.
    """
    lines = []
    if id is not None:
        lines.append(f"id: {id}")
    if event is not None:
        lines.append(f"event: {event}")
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False,
                                                            separators=(",", ":"))
    lines += [f"data: {line}" for line in payload.split("\n")]
    return ("\n".join(lines) + "\n\n").encode()


HEARTBEAT = b": keep-alive\n\n"
#: The payload of the last event of an OpenAI stream.
DONE = "[DONE]"


def sse_response(chunks: Iterable[bytes], on_disconnect: Callable[[], None] | None = None,
                 headers: dict[str, str] | None = None) -> Response:
    """Stream `chunks`; if the client leaves before they end, call on_disconnect.

    Only a departed client (the server closing us: GeneratorExit) is a disconnect; an
    error raised by `chunks` itself (Redis) is not, and must not cancel the job.
    """

    def guarded() -> Iterator[bytes]:
        try:
            yield from chunks
        except GeneratorExit:
            if on_disconnect is not None:
                on_disconnect()
            raise

    return Response(guarded(), mimetype="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})})


def client_connected() -> Callable[[], bool]:
    """A probe telling whether the client of this request is still there.

    For a response that is not streamed yet (a non-streaming call waiting for its
    job): peek at the socket gunicorn hands us; a readable socket that returns no
    bytes means the client closed it. Without a socket (test client) it says yes.
    """
    sock = request.environ.get("gunicorn.socket")
    if not isinstance(sock, socket.socket):
        return lambda: True

    def probe() -> bool:
        try:
            readable, _, _ = select.select([sock], [], [], 0)
            if not readable:
                return True
            return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            return True
        except OSError:
            return False

    return probe
