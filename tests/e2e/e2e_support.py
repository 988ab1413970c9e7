"""Helpers for the end-to-end tests (importable: conftest files are not)."""

from __future__ import annotations


def engine_stats(name: str) -> dict:
    """What the engine host of worker `name@…` observed (`celery inspect engine_stats`)."""
    import socket

    from tasks import app

    # Ask that one node and stop at its reply: an open broadcast waits out the timeout.
    replies = app.control.broadcast("engine_stats", reply=True, timeout=10, limit=1,
                                    destination=[f"{name}@{socket.gethostname()}"])
    for reply in replies:
        for node, stats in reply.items():
            if node.startswith(f"{name}@"):
                return stats
    raise AssertionError(f"no engine_stats reply from {name}@: {replies}")
