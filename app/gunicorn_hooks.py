"""gunicorn's hooks for the API (`tailguard api` runs gunicorn with ``-c python:app.gunicorn_hooks``)."""

from __future__ import annotations

import logging
import socket
import struct
from typing import Any

from tailguard import settings


def post_worker_init(worker: Any) -> None:
    """Once the app is loaded in gunicorn's worker process: bound how long a client may stall
    while its request is read, then start the app's background threads there (a thread
    started before the fork would not survive it)."""
    from app.gateway_ext import start_gateway

    set_read_timeout(worker.sockets, settings.API_READ_TIMEOUT_S.get(worker.wsgi.config))
    worker.log.error_log.addFilter(StalledClientLine())
    start_gateway(worker.wsgi)


def worker_exit(server: Any, worker: Any) -> None:
    """When the worker stops (SIGTERM, after its requests ended), before its interpreter exits:
    stop the app's background threads while what they use still works."""
    from app.gateway_ext import stop_gateway

    stop_gateway(worker.wsgi)


def set_read_timeout(listeners: list[Any], timeout_s: float) -> None:
    """SO_RCVTIMEO on the listening sockets, which every accepted connection inherits: a read
    of the request line, headers or body that gets no byte for `timeout_s` fails, and gunicorn
    drops the connection (the app answers a stalled body with a 408). gthread itself waits
    only for a connection's first byte without holding a thread (5 s), then reads with no
    timeout at all; a client that trickles a byte at a time still passes (docs/deployment.md:
    a proxy in front). Sends, and so streams, are not affected."""
    if timeout_s <= 0:
        return
    seconds = int(timeout_s)
    value = struct.pack("ll", seconds, int((timeout_s - seconds) * 1_000_000))
    for listener in listeners:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)


class StalledClientLine(logging.Filter):
    """gunicorn logs a read that timed out (SO_RCVTIMEO: EAGAIN) as "Socket error processing
    request." with a traceback: one line per dropped client instead, at warning level."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, BlockingIOError):
            record.msg, record.args, record.exc_info, record.exc_text = (
                f"dropped a client that sent nothing for {settings.API_READ_TIMEOUT_S.env} while "
                "its request was read", (), None, None)
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True
