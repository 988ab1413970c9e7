"""gunicorn's hooks for the API (`tailguard api` runs gunicorn with ``-c python:app.gunicorn_hooks``)."""

from __future__ import annotations

from typing import Any


def post_worker_init(worker: Any) -> None:
    """Once the app is loaded in gunicorn's worker process: start its background threads
    there (a thread started before the fork would not survive it)."""
    from app import start_background

    start_background(worker.wsgi)
