"""The tailguard REST API (Flask app factory; served by gunicorn: `gunicorn 'app:create_app()'`)."""

from __future__ import annotations

import threading
from typing import Any, Mapping

from flask import Flask, current_app

from tailguard import settings
from tailguard.gateway import Gateway

_gateway_lock = threading.Lock()


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    """Build the API. Nothing connects or loads here: the gateway is built on first use."""
    app = Flask(__name__)
    app.config.from_mapping(
        TAILGUARD_REDIS_URL=settings.redis_url(),
        TAILGUARD_MODEL=settings.MODEL.get(),
        TAILGUARD_LANES=settings.LANES_FILE.get() or None,
        TAILGUARD_MAX_WAIT_S=settings.MAX_WAIT_S.get(),
        MAX_CONTENT_LENGTH=settings.MAX_BODY_BYTES.get(),
        JSON_SORT_KEYS=False,
    )
    if config:
        app.config.update(config)
    app.json.ensure_ascii = False  # Chinese prompts and text stay readable

    from app import errors, health, jobs, openai_api

    errors.register(app)
    app.register_blueprint(jobs.bp)
    app.register_blueprint(openai_api.bp)
    app.register_blueprint(health.bp)
    return app


def get_gateway() -> Gateway:
    """The app's Gateway, built once per app from its config."""
    app = current_app
    gw = app.extensions.get("tailguard")
    if gw is None:
        with _gateway_lock:
            gw = app.extensions.get("tailguard")
            if gw is None:
                gw = app.extensions["tailguard"] = _build_gateway(app.config)
    return gw


def _build_gateway(config: Mapping[str, Any]) -> Gateway:
    import redis
    from celery import Celery

    from tailguard.errors import ConfigError
    from tailguard.jobs import JobStore
    from tailguard.lanes import load_lanes
    from tailguard.tokens import counter_for

    if not config["TAILGUARD_MODEL"]:
        raise ConfigError("TAILGUARD_MODEL is not set: the API needs the served model's tokenizer",
                          field="TAILGUARD_MODEL")
    url = config["TAILGUARD_REDIS_URL"]
    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=10)
    store = JobStore(client, ttl_s=settings.JOB_TTL_S.get(),
                     worker_lost_grace_s=settings.WORKER_LOST_GRACE_S.get())
    # A producer-only Celery app: it publishes by task name and never imports the task bodies.
    producer = Celery("tailguard-api", set_as_current=False)
    producer.config_from_object("celeryconfig")
    producer.conf.update(broker_url=url, result_backend=url)
    return Gateway(load_lanes(config["TAILGUARD_LANES"]), store,
                   counter_for(config["TAILGUARD_MODEL"]), producer)
