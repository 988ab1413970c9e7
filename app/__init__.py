"""The tailguard REST API (Flask app factory; served by gunicorn: `gunicorn 'app:create_app()'`)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from flask import Flask, current_app, g, request

from tailguard import settings
from tailguard.gateway.service import Gateway

_gateway_lock = threading.Lock()


#: Every setting the API reads: create_app puts each into app.config under its env name.
APP_SETTINGS = (settings.REDIS_URL, settings.REDIS_SENTINEL_MASTER, settings.REDIS_SENTINEL_PASSWORD,
                settings.MODEL, settings.SERVED_MODEL_NAME, settings.LANES_FILE,
                settings.MAX_BODY_BYTES, settings.MAX_WAIT_S, settings.JOB_TTL_S,
                settings.WORKER_LOST_GRACE_S, settings.STREAM_MAXLEN, settings.SSE_HEARTBEAT_S,
                settings.STATS_RETENTION_S, settings.REQUEST_LOG, settings.RATE_WINDOW_S,
                settings.PRIOR_TOKENS_PER_S, settings.ADMIT_WITHOUT_WORKER, settings.API_THREADS,
                settings.WORKER_HEARTBEAT_S, settings.REDELIVER_AFTER_S,
                settings.REDIS_SOCKET_TIMEOUT_S)


def create_app(test_config: Mapping[str, Any] | None = None) -> Flask:
    """Build the API. Nothing connects, loads or starts here: the gateway is built on first
    use, and the process's background threads start with `start_background`.

    app.config holds every setting the API reads, keyed by its env name: the
    environment's value (or the default), overridden by `test_config`. Views read
    them from there (``settings.X.get(current_app.config)``), never from the environment.
    """
    app = Flask(__name__)
    app.config.from_mapping({s.env: s.get() for s in APP_SETTINGS}, JSON_SORT_KEYS=False,
                            TAILGUARD_CONSUME_FINISHED=True, TAILGUARD_REAP_RUNNING=True)
    app.config[settings.REDIS_URL.env] = settings.redis_url()
    if test_config:
        app.config.update(test_config)
    app.config["MAX_CONTENT_LENGTH"] = settings.MAX_BODY_BYTES.get(app.config)  # Flask's name for it
    if settings.SSE_HEARTBEAT_S.get(app.config) >= settings.REDIS_SOCKET_TIMEOUT_S.get(app.config):
        from tailguard.errors import ConfigError

        raise ConfigError(f"{settings.SSE_HEARTBEAT_S.env} must be below "
                          f"{settings.REDIS_SOCKET_TIMEOUT_S.env}: a stream blocks on Redis that long",
                          field=settings.SSE_HEARTBEAT_S.env)
    _setup_request_log(settings.REQUEST_LOG.get(app.config))
    app.json.ensure_ascii = False  # Chinese prompts and text stay readable

    from app import errors, health, jobs, openai_api, openapi

    errors.register(app)

    @app.before_request
    def _authenticate() -> None:
        """Every /v1/ route needs an API key once one exists; /healthz and /metrics never do."""
        if needs_api_key(request.path):
            g.api_key = get_gateway().api_keys.authenticate(request.headers.get("Authorization"))

    app.register_blueprint(jobs.bp)
    app.register_blueprint(openai_api.bp)
    app.register_blueprint(health.bp)
    app.register_blueprint(openapi.bp)
    return app


def needs_api_key(path: str) -> bool:
    """Whether a request to ``path`` must carry an API key (once one exists)."""
    return path.startswith("/v1/")


def json_body() -> Any:
    """The decoded JSON body of this POST: 415 unless sent as application/json (a web page can
    send text/plain or a form cross-origin without a CORS preflight; never read those), 400
    unless it parses."""
    from tailguard.errors import InvalidField, UnsupportedMediaType

    if not request.is_json:
        raise UnsupportedMediaType(
            f"send the body as application/json (got {request.mimetype or 'no content type'})",
            field="Content-Type")
    body = request.get_json(silent=True)
    if body is None:
        raise InvalidField("the body must be valid JSON", field="body")
    return body


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


def _setup_request_log(path: str) -> None:
    """The request log: JSON lines to `path` (TAILGUARD_REQUEST_LOG), else to stdout (gunicorn's log)."""
    import logging
    import sys

    logger = logging.getLogger("tailguard.requests")
    if logger.handlers:
        return
    handler = logging.FileHandler(path) if path else logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def redis_client(url: str, timeout_s: float, max_connections: int | None = None,
                 config: Mapping[str, Any] | None = None):
    """The API's Redis client: every call bounded by `timeout_s`, so a request answers 503
    within about that while Redis is down or stopped, never hangs. A dropped connection (a
    restarted Redis) is retried once on a new one: the pool reconnects by itself (through the
    Sentinels, to the current master, with a sentinel:// URL; `config` holds their settings)."""
    import redis
    from redis.backoff import ConstantBackoff
    from redis.retry import Retry

    from tailguard.redis.client import connect

    return connect(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s, config=config,
                   retry=Retry(ConstantBackoff(0.1), 1, (redis.ConnectionError,)),
                   health_check_interval=30, max_connections=max_connections)


def _build_gateway(config: Mapping[str, Any]) -> Gateway:
    from celery import Celery

    from tailguard.errors import ConfigError
    from tailguard.jobs.finished import FinishedConsumer, log_request
    from tailguard.jobs.lane_load import LaneLoadStore
    from tailguard.jobs.store import JobStore
    from tailguard.jobs.task_message import TaskMessages
    from tailguard.lanes.admission import AdmissionPolicy
    from tailguard.lanes.table import load_lanes
    from tailguard.model.tokens import counter_for
    from tailguard.observe.metrics import GatewayMetrics
    from tailguard.observe.stats import StatsStore
    from tailguard.redis.client import celery_transport_options

    model = settings.MODEL.get(config)
    if not model:
        raise ConfigError(f"{settings.MODEL.env} is not set: the API needs the served model's tokenizer",
                          field=settings.MODEL.env)
    url = settings.REDIS_URL.get(config)
    # Every request thread may hold a connection (an SSE stream blocks in XREAD), plus the
    # finished-stream consumer: redis-py's pool stops at 100 unless told otherwise.
    timeout_s = settings.REDIS_SOCKET_TIMEOUT_S.get(config)
    client = redis_client(url, timeout_s, max_connections=settings.API_THREADS.get(config) + 16,
                          config=config)
    store = JobStore.from_settings(client, config)
    # A producer-only Celery app: it publishes by task name and never imports the task bodies.
    producer = Celery("tailguard-api", set_as_current=False)
    producer.config_from_object("celeryconfig")
    sentinel_options = celery_transport_options(url, timeout_s, config)
    producer.conf.update(
        broker_url=url, result_backend=url,
        broker_transport_options={**producer.conf.broker_transport_options, **sentinel_options},
        result_backend_transport_options={**producer.conf.result_backend_transport_options,
                                          **sentinel_options})
    lanes = load_lanes(settings.LANES_FILE.get(config) or None)
    metrics = GatewayMetrics(lanes.names, client)
    stats = StatsStore(client, retention_s=settings.STATS_RETENTION_S.get(config))
    load = LaneLoadStore(client, window_s=settings.RATE_WINDOW_S.get(config))
    admission = AdmissionPolicy(prior_tokens_per_s=settings.PRIOR_TOKENS_PER_S.get(config),
                                admit_without_worker=settings.ADMIT_WITHOUT_WORKER.get(config))
    gateway = Gateway(lanes, store, counter_for(model), TaskMessages(producer), metrics=metrics,
                      admission=admission, load=load, stats=stats)
    # Every finished request, whoever ended it: one log line, metrics, `tailguard stats`,
    # and the lane's measured service rate (admission). Started by start_background.
    gateway.finished = FinishedConsumer(client, [log_request, metrics.observe, stats.record,
                                                 load.record])
    gateway.producer = producer
    return gateway


def start_background(app: Flask) -> Gateway:
    """Start the API process's own background work, once, when the process starts (gunicorn's
    post_worker_init hook, app/gunicorn_hooks.py): the consumer of finished jobs, and the
    reaper that ends dead workers' running jobs within seconds, read or not (workers reap
    too). Each is on unless the app's config turns it off (TAILGUARD_CONSUME_FINISHED,
    TAILGUARD_REAP_RUNNING: tests that run several apps in one process do)."""
    with app.app_context():
        gateway = get_gateway()
    config = app.config
    with _gateway_lock:
        if gateway.background_started:
            return gateway
        gateway.background_started = True
    if config["TAILGUARD_CONSUME_FINISHED"] and gateway.finished is not None:
        gateway.finished.start()
    if config["TAILGUARD_REAP_RUNNING"]:
        from tailguard.jobs.liveness import Liveness
        from tailguard.jobs.reaper import Reaper
        from tailguard.jobs.redeliver import Redeliverer

        store, lanes = gateway.store, gateway.lanes
        heartbeat_s = settings.WORKER_HEARTBEAT_S.get(config)
        Reaper(store, Liveness(store.redis), heartbeat_s,
               Redeliverer(store, gateway.producer.connection_for_write,
                           settings.REDELIVER_AFTER_S.get(config), lanes.lanes,
                           confirm_s=heartbeat_s)
               ).start(gateway.stopping)
    return gateway
