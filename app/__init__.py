"""The tailguard REST API (Flask app factory; served by gunicorn: `gunicorn 'app:create_app()'`)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from flask import Flask, Response, after_this_request, current_app, g, request

from tailguard import settings
from tailguard.gateway.service import Gateway
from tailguard.settings import AUTH_KEYS, AUTH_OPEN

_gateway_lock = threading.Lock()

#: the default byte bound of a prompt (TAILGUARD_MAX_PROMPT_BYTES), per token of the model's
#: max length: no real text needs more bytes a token, so a longer prompt would not fit its context
PROMPT_BYTES_PER_TOKEN = 32


#: Every setting the API reads: create_app puts each into app.config under its env name.
APP_SETTINGS = (settings.REDIS_URL, settings.REDIS_SENTINEL_MASTER, settings.REDIS_SENTINEL_PASSWORD,
                settings.MODEL, settings.SERVED_MODEL_NAME, settings.LANES_FILE,
                settings.MAX_BODY_BYTES, settings.MAX_WAIT_S, settings.JOB_TTL_S,
                settings.RECORD_TTL_S, settings.OUTPUT_TTL_S, settings.REDIS_HIGH_WATER,
                settings.WORKER_LOST_GRACE_S, settings.STREAM_MAXLEN, settings.SSE_HEARTBEAT_S,
                settings.STATS_RETENTION_S, settings.REQUEST_LOG, settings.RATE_WINDOW_S,
                settings.PRIOR_TOKENS_PER_S, settings.ADMIT_WITHOUT_WORKER, settings.API_THREADS,
                settings.WORKER_HEARTBEAT_S, settings.REDELIVER_AFTER_S,
                settings.REDIS_SOCKET_TIMEOUT_S, settings.API_AUTH, settings.API_OPEN,
                settings.API_TRUSTED_HOSTS, settings.API_READ_TIMEOUT_S, settings.MAX_WAITS_PER_KEY,
                settings.MAX_PROMPT_BYTES, settings.METRICS_KEY_NAMES, settings.OPENAI_ARGS)


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
    auth, open_remote = _auth_config(app.config)

    from app import errors, health, jobs, openai_api, openapi

    errors.register(app)

    @app.before_request
    def _authenticate() -> None:
        """Keys mode: every /v1/ route needs an API key (/healthz and /metrics never do), and
        each call is charged to its key's requests per minute before anything else is done
        for it. Open mode: no key, and only clients on this machine unless TAILGUARD_API_OPEN."""
        from tailguard.errors import Unauthenticated
        from tailguard.gateway.api_keys import is_loopback

        if auth == AUTH_OPEN:
            # no peer address: a Unix socket (or an in-process client), this machine's alone
            peer = request.remote_addr
            if not open_remote and peer and not is_loopback(peer):
                raise Unauthenticated(f"this API runs without API keys ({settings.API_AUTH.env}=open) "
                                      "and serves clients on its own machine only")
            return
        if needs_api_key(request.path):
            gw = get_gateway()
            g.api_key = gw.api_keys.authenticate(request.headers.get("Authorization"))
            gw.charge_call(g.api_key)

    app.register_blueprint(jobs.bp)
    app.register_blueprint(openai_api.bp)
    app.register_blueprint(openai_api.server_bp)
    app.register_blueprint(health.bp)
    app.register_blueprint(openapi.bp)
    return app


def _auth_config(config: dict[str, Any]) -> tuple[str, bool]:
    """The app's authentication mode (TAILGUARD_API_AUTH; keys unless set: `tailguard api`
    resolves the default from its bind and sets it), whether open mode serves remote clients
    (TAILGUARD_API_OPEN), and the Host headers it answers, put in Flask's TRUSTED_HOSTS
    (a 400 for any other: DNS rebinding)."""
    auth = settings.API_AUTH.get(config) or AUTH_KEYS
    config[settings.API_AUTH.env] = auth
    open_remote = settings.API_OPEN.get(config)
    hosts = [h.strip() for h in settings.API_TRUSTED_HOSTS.get(config).split(",") if h.strip()]
    if not hosts and auth == AUTH_OPEN and not open_remote:
        from tailguard.gateway.api_keys import LOOPBACK_HOSTS

        hosts = list(LOOPBACK_HOSTS)
    config["TRUSTED_HOSTS"] = hosts or None
    return auth, open_remote


#: vLLM's routes outside /v1 that spend the API's CPU on a client's text: a key's, as /v1's
KEYED_SERVER_PATHS = frozenset({"/tokenize", "/detokenize"})


def needs_api_key(path: str) -> bool:
    """Whether a request to ``path`` must carry an API key (in keys mode): every /v1/ route,
    and vLLM's /tokenize and /detokenize (vLLM's own server asks none there)."""
    return path.startswith("/v1/") or path in KEYED_SERVER_PATHS


def hold_wait_slot() -> None:
    """Hold one of the caller's key's wait slots (TAILGUARD_MAX_WAITS_PER_KEY) until this
    request's response is closed, a stream's when it ends or its client goes away; a 429
    when the key holds them all. Called first by every view that may wait."""
    release = get_gateway().hold_wait(g.get("api_key"))

    @after_this_request
    def _release_when_closed(response: Response) -> Response:
        response.call_on_close(release)
        return response


def json_body() -> Any:
    """The decoded JSON body of this POST: 415 unless sent as application/json (a web page can
    send text/plain or a form cross-origin without a CORS preflight; never read those), 400
    unless it parses."""
    from tailguard.errors import InvalidField, UnsupportedMediaType

    if not request.is_json:
        raise UnsupportedMediaType(
            f"send the body as application/json (got {request.mimetype or 'no content type'})",
            field="Content-Type")
    from werkzeug.exceptions import ClientDisconnected

    try:
        body = request.get_json(silent=True)
    except RecursionError:
        raise InvalidField("the body nests too deeply to be read", field="body") from None
    except (ClientDisconnected, OSError):
        # shorter than its Content-Length: the socket's read timed out
        # (TAILGUARD_API_READ_TIMEOUT_S, app/gunicorn_hooks.py) or the client left
        from tailguard.errors import RequestTimeout

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
    from tailguard.errors import InvalidField

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
    from tailguard.gateway.openai_frontend import OpenAIFrontend
    from tailguard.jobs.finished import FinishedConsumer, log_request
    from tailguard.jobs.lane_load import LaneLoadStore
    from tailguard.jobs.store import JobStore
    from tailguard.jobs.task_message import TaskMessages
    from tailguard.lanes.admission import AdmissionPolicy
    from tailguard.lanes.table import load_lanes
    from tailguard.model.info import served_model_names
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
    metrics = GatewayMetrics(lanes.names, client, key_names=settings.METRICS_KEY_NAMES.get(config))
    stats = StatsStore(client, retention_s=settings.STATS_RETENTION_S.get(config))
    load = LaneLoadStore(client, window_s=settings.RATE_WINDOW_S.get(config))
    admission = AdmissionPolicy(prior_tokens_per_s=settings.PRIOR_TOKENS_PER_S.get(config),
                                admit_without_worker=settings.ADMIT_WITHOUT_WORKER.get(config))
    counter = counter_for(model)
    max_prompt_bytes = settings.MAX_PROMPT_BYTES.get(config) or (
        PROMPT_BYTES_PER_TOKEN * counter.model_max_len if counter.model_max_len
        else settings.MAX_BODY_BYTES.get(config))
    # vLLM's render layer for the OpenAI routes: built when the process starts (or on the
    # first OpenAI request), never for the native ones; vLLM's defaults count with the
    # longest context a lane serves, which /v1/models reports
    openai = OpenAIFrontend(
        model, served_model_names(model, settings.SERVED_MODEL_NAME.get(config)),
        max(lane.context_len(counter.model_max_len) for lane in lanes),
        settings.OPENAI_ARGS.get(config), lanes.engine, on_ignored=metrics.on_ignored_fields)
    gateway = Gateway(lanes, store, counter, TaskMessages(producer), metrics=metrics,
                      admission=admission, load=load, stats=stats, max_prompt_bytes=max_prompt_bytes,
                      max_waits_per_key=settings.MAX_WAITS_PER_KEY.get(config), openai=openai)
    # Every finished request, whoever ended it: one log line, metrics, `tailguard stats`,
    # and the lane's measured service rate (admission). Started by start_background.
    gateway.finished = FinishedConsumer(client, [log_request, metrics.observe, stats.record,
                                                 load.record])
    gateway.producer = producer
    return gateway


def start_background(app: Flask) -> Gateway:
    """Start the API process's own background work, once, when the process starts (gunicorn's
    post_worker_init hook, app/gunicorn_hooks.py): building vLLM's render layer for the OpenAI
    routes, the consumer of finished jobs, and the reaper that ends dead workers' running
    jobs within seconds, read or not (workers reap too). The last two are on unless the
    app's config turns them off (TAILGUARD_CONSUME_FINISHED, TAILGUARD_REAP_RUNNING: tests
    that run several apps in one process do)."""
    with app.app_context():
        gateway = get_gateway()
    config = app.config
    with _gateway_lock:
        if gateway.background_started:
            return gateway
        gateway.background_started = True
    if gateway.openai is not None:
        gateway.openai.start()
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
