"""The app's Gateway as a Flask extension: built whole on first use from app.config (its Redis
client, Celery producer, lanes, metrics, render layer, finished-jobs consumer and reaper),
started by `start_gateway` when the serving process starts. Views get it with `get_gateway`.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Mapping
from typing import Any

from flask import Flask, current_app

from tailguard import settings
from tailguard.batches.feeder import BatchFeeder
from tailguard.batches.service import BatchService
from tailguard.errors import ConfigError
from tailguard.gateway.service import Gateway

#: the default byte bound of a prompt (TAILGUARD_MAX_PROMPT_BYTES), per token of the model's
#: max length: no real text needs more bytes a token, so a longer prompt would not fit its context
PROMPT_BYTES_PER_TOKEN = 32
#: the Gateway's name in app.extensions
EXTENSION = "tailguard"
#: the Batch API's (its service and feeder) in app.extensions
BATCHES_EXTENSION = "tailguard.batches"

_gateway_lock = threading.Lock()


def init_app(app: Flask) -> None:
    """Register the gateway's resources with the app: the request log now; the gateway itself
    on first use (`get_gateway`), so that building an app connects nowhere."""
    _setup_request_log(settings.REQUEST_LOG.get(app.config))


def get_gateway() -> Gateway:
    """The app's Gateway, built once per app from its config."""
    app = current_app
    gw = app.extensions.get(EXTENSION)
    if gw is None:
        with _gateway_lock:
            gw = app.extensions.get(EXTENSION)
            if gw is None:
                gw = app.extensions[EXTENSION] = build_gateway(app.config)
    return gw


def get_batches() -> BatchService:
    """The app's Batch API service, built once per app (with its feeder) from its config."""
    return _batches(current_app)[0]


def _batches(app: Flask) -> tuple[BatchService, BatchFeeder]:
    built = app.extensions.get(BATCHES_EXTENSION)
    if built is None:
        with app.app_context():
            gateway = get_gateway()
        with _gateway_lock:
            built = app.extensions.get(BATCHES_EXTENSION)
            if built is None:
                built = app.extensions[BATCHES_EXTENSION] = build_batches(app.config, gateway)
    return built


def built_gateway(app: Flask) -> Gateway | None:
    """The app's Gateway if it was built already (never builds one: Redis may be down)."""
    return app.extensions.get(EXTENSION)


def start_gateway(app: Flask) -> Gateway:
    """Start the API process's own background work, once, when the process starts (gunicorn's
    post_worker_init hook, app/gunicorn_hooks.py): Gateway.start, and the batch feeder."""
    with app.app_context():
        gateway = get_gateway()
    gateway.start()
    _batches(app)[1].start()
    return gateway


def stop_gateway(app: Flask) -> None:
    """Stop what `start_gateway` started, the batch feeder first: it renders lines with the
    gateway's render layer, whose tokenizer pool vLLM shuts down at interpreter exit."""
    batches = app.extensions.get(BATCHES_EXTENSION)
    if batches is not None:
        batches[1].close()
    gateway = built_gateway(app)
    if gateway is not None:
        gateway.close()


def _setup_request_log(path: str) -> None:
    """The request log: JSON lines to `path` (TAILGUARD_REQUEST_LOG), else to stdout (gunicorn's log)."""
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


def _producer(url: str, timeout_s: float, config: Mapping[str, Any]) -> Any:
    """A producer-only Celery app: it publishes by task name and never imports the task bodies."""
    from celery import Celery

    from tailguard.redis.client import celery_transport_options

    producer = Celery("tailguard-api", set_as_current=False)
    producer.config_from_object("celeryconfig")
    sentinel_options = celery_transport_options(url, timeout_s, config)
    producer.conf.update(
        broker_url=url, result_backend=url,
        broker_transport_options={**producer.conf.broker_transport_options, **sentinel_options},
        result_backend_transport_options={**producer.conf.result_backend_transport_options,
                                          **sentinel_options})
    return producer


def build_gateway(config: Mapping[str, Any]) -> Gateway:
    """The Gateway and every collaborator it is given, from the app's config."""
    from tailguard.gateway.openai_frontend import OpenAIFrontend
    from tailguard.jobs.finished import FinishedConsumer, log_request
    from tailguard.jobs.lane_load import LaneLoadStore
    from tailguard.jobs.liveness import Liveness
    from tailguard.jobs.prefix_index import PrefixIndex
    from tailguard.jobs.reaper import Reaper
    from tailguard.jobs.redeliver import Redeliverer
    from tailguard.jobs.store import JobStore
    from tailguard.jobs.task_message import TaskMessages
    from tailguard.lanes.admission import AdmissionPolicy
    from tailguard.lanes.table import load_lanes
    from tailguard.model.info import served_model_names
    from tailguard.model.tokens import counter_for
    from tailguard.observe.metrics import GatewayMetrics
    from tailguard.observe.stats import StatsStore

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
    producer = _producer(url, timeout_s, config)
    lanes = load_lanes(settings.LANES_FILE.get(config) or None)
    metrics = GatewayMetrics(lanes.names, client, key_names=settings.METRICS_KEY_NAMES.get(config))
    stats = StatsStore(client, retention_s=settings.STATS_RETENTION_S.get(config))
    load = LaneLoadStore(client, window_s=settings.RATE_WINDOW_S.get(config))
    admission = AdmissionPolicy(prior_tokens_per_s=settings.PRIOR_TOKENS_PER_S.get(config),
                                prefill_tokens_per_s=settings.PREFILL_TOKENS_PER_S.get(config),
                                first_step_s=settings.FIRST_STEP_S.get(config),
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
    # Every finished request, whoever ended it: one log line, metrics, `tailguard stats`,
    # and the lane's measured service rate (admission).
    finished = FinishedConsumer(client, [log_request, metrics.observe, stats.record, load.record],
                                keep_s=settings.RECORD_TTL_S.get(config))
    offers = PrefixIndex.from_settings(client, config)  # None: prefix affinity is off
    # Ends dead workers' running jobs within seconds, read or not (workers reap too).
    reaper = None
    if config["TAILGUARD_REAP_RUNNING"]:
        heartbeat_s = settings.WORKER_HEARTBEAT_S.get(config)
        reaper = Reaper(store, Liveness(store.redis), heartbeat_s,
                        Redeliverer(store, producer.connection_for_write,
                                    settings.REDELIVER_AFTER_S.get(config), lanes.lanes,
                                    confirm_s=heartbeat_s, offers=offers))
    return Gateway(lanes, store, counter, TaskMessages(producer), metrics=metrics,
                   admission=admission, load=load, stats=stats, max_prompt_bytes=max_prompt_bytes,
                   max_waits_per_key=settings.MAX_WAITS_PER_KEY.get(config), openai=openai,
                   model=model, finished=finished,
                   consume_finished=config["TAILGUARD_CONSUME_FINISHED"], reaper=reaper,
                   # resolved by app.auth when the app was made (open, or keys unless set)
                   auth_mode=settings.API_AUTH.get(config) or None,
                   fair_share=settings.FAIR_SHARE.get(config),
                   affinity=_prefix_affinity(config, offers, metrics, lanes.engine))


def _prefix_affinity(config: Mapping[str, Any], index: Any, metrics: Any,
                     engine: Mapping[str, Any]) -> Any:
    """Prefix affinity (a PrefixAffinity) when TAILGUARD_PREFIX_AFFINITY is on (`index`: its
    PrefixIndex; its offers exported), else None."""
    from tailguard.gateway.service import PrefixAffinity
    from tailguard.lanes.affinity import engine_block_tokens

    if index is None:
        return None
    metrics.watch_offers(index.outcomes)
    block = settings.PREFIX_BLOCK_TOKENS.get(config) or engine_block_tokens(
        engine, settings.DEVICE.get(config))
    return PrefixAffinity(index, block)


def build_batches(config: Mapping[str, Any], gateway: Gateway) -> tuple[BatchService, BatchFeeder]:
    """The Batch API's service and feeder, on the gateway's Redis, from the app's config."""
    from tailguard.batches.contents import Contents
    from tailguard.batches.metrics import BatchCollector
    from tailguard.batches.store import BatchStore

    location = settings.BATCH_STORAGE.get(config) or str(settings.home() / "batch-files")
    store = BatchStore(gateway.store.redis, Contents(location),
                       output_ttl_s=settings.BATCH_OUTPUT_TTL_S.get(config))
    max_lines = settings.BATCH_MAX_LINES.get(config)
    max_bytes = settings.BATCH_MAX_FILE_BYTES.get(config)
    feeder = BatchFeeder(store, gateway, lines_in_flight=settings.BATCH_LINES_IN_FLIGHT.get(config),
                         period_s=settings.BATCH_FEED_S.get(config), max_lines=max_lines,
                         max_file_bytes=max_bytes)
    try:
        gateway.metrics.registry.register(BatchCollector(store.redis))
    except ValueError:  # registered by a Batch API built before on this gateway (tests rebuild it)
        pass
    return BatchService(store, max_bytes, gateway.store.storage,
                        max_bytes_per_key=settings.BATCH_MAX_BYTES_PER_KEY.get(config),
                        max_running_per_key=settings.BATCH_MAX_RUNNING_PER_KEY.get(config)), feeder
