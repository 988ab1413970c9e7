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
    app.config.setdefault("TAILGUARD_CONSUME_FINISHED", True)
    if config:
        app.config.update(config)
    _setup_request_log()
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


def _setup_request_log() -> None:
    """The request log: JSON lines to $TAILGUARD_REQUEST_LOG, else to stdout (gunicorn's log)."""
    import logging
    import sys

    logger = logging.getLogger("tailguard.requests")
    if logger.handlers:
        return
    path = settings.REQUEST_LOG.get()
    handler = logging.FileHandler(path) if path else logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def _build_gateway(config: Mapping[str, Any]) -> Gateway:
    import redis
    from celery import Celery

    from tailguard.errors import ConfigError
    from tailguard.finished import FinishedConsumer, log_request
    from tailguard.jobs import JobStore
    from tailguard.lanes import load_lanes
    from tailguard.metrics import GatewayMetrics
    from tailguard.stats import StatsStore
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
    lanes = load_lanes(config["TAILGUARD_LANES"])
    metrics = GatewayMetrics(lanes.names, client)
    gateway = Gateway(lanes, store, counter_for(config["TAILGUARD_MODEL"]), producer, metrics=metrics)
    # Every finished request, whoever ended it: one log line, metrics, `tailguard stats`.
    stats = StatsStore(client, retention_s=settings.STATS_RETENTION_S.get())
    gateway.finished = FinishedConsumer(client, [log_request, metrics.observe, stats.record])
    if config["TAILGUARD_CONSUME_FINISHED"]:
        gateway.finished.start()
    return gateway
