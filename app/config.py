"""The API's configuration: every setting it reads, in app.config under its env name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flask import Flask

from tailguard import settings
from tailguard.errors import ConfigError

#: Every setting the API reads: init_app puts each into app.config under its env name.
APP_SETTINGS = (settings.REDIS_URL, settings.REDIS_SENTINEL_MASTER, settings.REDIS_SENTINEL_PASSWORD,
                settings.MODEL, settings.SERVED_MODEL_NAME, settings.LANES_FILE,
                settings.MAX_BODY_BYTES, settings.MAX_WAIT_S, settings.JOB_TTL_S,
                settings.RECORD_TTL_S, settings.OUTPUT_TTL_S, settings.REDIS_HIGH_WATER,
                settings.WORKER_LOST_GRACE_S, settings.STREAM_MAXLEN, settings.SSE_HEARTBEAT_S,
                settings.STATS_RETENTION_S, settings.REQUEST_LOG, settings.RATE_WINDOW_S,
                settings.PRIOR_TOKENS_PER_S, settings.PREFILL_TOKENS_PER_S, settings.FIRST_STEP_S,
                settings.ADMIT_WITHOUT_WORKER, settings.FAIR_SHARE,
                settings.API_THREADS,
                settings.WORKER_HEARTBEAT_S, settings.REDELIVER_AFTER_S,
                settings.REDIS_SOCKET_TIMEOUT_S, settings.API_AUTH, settings.API_OPEN,
                settings.API_TRUSTED_HOSTS, settings.API_READ_TIMEOUT_S, settings.MAX_WAITS_PER_KEY,
                settings.MAX_PROMPT_BYTES, settings.METRICS_KEY_NAMES, settings.OPENAI_ARGS,
                settings.BATCH_STORAGE, settings.BATCH_MAX_LINES, settings.BATCH_MAX_FILE_BYTES,
                settings.BATCH_OUTPUT_TTL_S, settings.BATCH_LINES_IN_FLIGHT, settings.BATCH_FEED_S,
                settings.BATCH_MAX_BYTES_PER_KEY, settings.BATCH_MAX_RUNNING_PER_KEY,
                settings.PREFIX_AFFINITY, settings.PREFIX_AFFINITY_WAIT_S,
                settings.PREFIX_BLOCK_TOKENS, settings.PREFIX_INDEX_TTL_S, settings.DEVICE)


def init_app(app: Flask, test_config: Mapping[str, Any] | None = None) -> None:
    """app.config holds every setting the API reads, keyed by its env name: the environment's
    value (or the default), overridden by `test_config`. Views read them from there
    (``settings.X.get(current_app.config)``), never from the environment.
    TAILGUARD_CONSUME_FINISHED and TAILGUARD_REAP_RUNNING (not settings: tests that run
    several apps in one process turn them off) say which background threads the gateway
    starts."""
    app.config.from_mapping({s.env: s.get() for s in APP_SETTINGS}, JSON_SORT_KEYS=False,
                            TAILGUARD_CONSUME_FINISHED=True, TAILGUARD_REAP_RUNNING=True)
    app.config[settings.REDIS_URL.env] = settings.redis_url()
    if test_config:
        app.config.update(test_config)
    app.config["MAX_CONTENT_LENGTH"] = settings.MAX_BODY_BYTES.get(app.config)  # Flask's name for it
    if settings.SSE_HEARTBEAT_S.get(app.config) >= settings.REDIS_SOCKET_TIMEOUT_S.get(app.config):
        raise ConfigError(f"{settings.SSE_HEARTBEAT_S.env} must be below "
                          f"{settings.REDIS_SOCKET_TIMEOUT_S.env}: a stream blocks on Redis that long",
                          field=settings.SSE_HEARTBEAT_S.env)
