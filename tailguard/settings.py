"""Every tailguard knob that is not a Celery setting or a lane: one typed registry.

Each setting is read from the environment when asked for (never at import time),
so tests and ``tailguard up`` can set the environment before anything reads it.
``python -m tailguard.settings`` prints the effective values.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from tailguard.errors import ConfigError

T = TypeVar("T")


@dataclass(frozen=True)
class Setting(Generic[T]):
    env: str
    default: T
    parse: Callable[[str], T]
    doc: str

    def get(self, config: Mapping[str, Any] | None = None) -> T:
        """The value in `config` (keyed by env name: a Flask app's config) if there, else the
        environment's, else the default."""
        if config is not None and self.env in config:
            return config[self.env]
        raw = os.environ.get(self.env)
        if raw is None or raw == "":
            return self.default
        try:
            return self.parse(raw)
        except ValueError as exc:
            raise ConfigError(f"{self.env}={raw!r}: {exc}", field=self.env) from None


def _bool(raw: str) -> bool:
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected a boolean (1/0, true/false)")


REDIS_URL = Setting(
    "TAILGUARD_REDIS_URL", "", str,
    "Redis for broker, results and job records: redis://, rediss:// (TLS, with ssl_* options) or "
    "kombu's sentinel:// list (see TAILGUARD_REDIS_SENTINEL_MASTER). Empty: `tailguard up` starts "
    "a private redis-server and everything else uses redis://127.0.0.1:6379/0.")
REDIS_SENTINEL_MASTER = Setting(
    "TAILGUARD_REDIS_SENTINEL_MASTER", "", str,
    "With a sentinel:// TAILGUARD_REDIS_URL (kombu's list, `;` between Sentinels): the name of "
    "the master the Sentinels monitor. Required then; unused otherwise.")
REDIS_SENTINEL_PASSWORD = Setting(
    "TAILGUARD_REDIS_SENTINEL_PASSWORD", "", str,
    "Password of the Sentinels themselves (their requirepass), when they have one; the "
    "password in the sentinel:// URL is the master's.")
MODEL = Setting(
    "TAILGUARD_MODEL", "", str,
    "Served model: a Hugging Face id or a local directory. Empty: `tailguard up` builds and serves "
    "the random-weight demo model (its text is noise).")
SERVED_MODEL_NAME = Setting(
    "TAILGUARD_SERVED_MODEL_NAME", "", str,
    "The `model` name OpenAI clients use (vLLM's --served-model-name). Empty: "
    "`tailguard-demo` for the demo model, else TAILGUARD_MODEL itself.")
DTYPE = Setting(
    "TAILGUARD_DTYPE", "", str,
    "vLLM's dtype for the engine (auto, bfloat16, float32, ...). Empty: what a demo model records "
    "it was verified with (float32 for tiny), else auto.")
LANES_FILE = Setting(
    "TAILGUARD_LANES", "", str,
    "Path of the lanes TOML. Empty: the default tailguard/lanes/lanes.toml shipped with the package.")
HOME = Setting(
    "TAILGUARD_HOME", ".tailguard", str,
    "State directory of `tailguard up`: embedded Redis data and AOF, demo model, logs.")
DEMO_SIZE = Setting(
    "TAILGUARD_DEMO_SIZE", "small", str,
    "Size of the demo model `tailguard up` builds when TAILGUARD_MODEL is empty: tiny or small.")
DEVICE = Setting(
    "TAILGUARD_DEVICE", "auto", str,
    "cpu, cuda or auto (cuda when `nvidia-smi -L` lists a GPU). Decides how workers are pinned.")
FRONTEND_CORES = Setting(
    "TAILGUARD_FRONTEND_CORES", "auto", str,
    "CPU host: the cores `tailguard up` and `tailguard bench` run the front end on (API, Redis, "
    "Flower, each worker's own threads, the bench's load generator): auto (the last [[workers]] "
    "entry's cores, with two or more workers), none (anywhere), or a list such as 1 or 2-3. The "
    "engine on those cores runs at TAILGUARD_ENGINE_NICE. See tailguard/host/cores.py.")
ENGINE_NICE = Setting(
    "TAILGUARD_ENGINE_NICE", 10, int,
    "CPU host: the nice value of an engine whose cores the front end shares "
    "(TAILGUARD_FRONTEND_CORES), so front-end work runs first there; 0 leaves it as is.")
ENGINE_CORE_ROAM = Setting(
    "TAILGUARD_ENGINE_CORE_ROAM", True, _bool,
    "CPU host: an engine whose cores are not the front end's moves its vLLM engine-core process "
    "onto the front-end cores while they are idle, and back as soon as they are busy "
    "(tailguard/host/roaming.py).")
VLLM_METRICS = Setting(
    "TAILGUARD_VLLM_METRICS", True, _bool,
    "Workers keep vLLM's own stat loggers: its vllm:* metrics on each worker's /metrics and "
    "its throughput log lines. Off (as vLLM's --disable-log-stats) skips their work on every "
    "engine step in the worker's process, the front end's CPU (benchmarks/vllm_stats_cost.py "
    "measures it); tailguard's own worker metrics stay.")
API_PORT = Setting("TAILGUARD_API_PORT", 8000, int, "Port of the REST API (gunicorn).")
API_THREADS = Setting(
    "TAILGUARD_API_THREADS", 1024, int,
    "gunicorn gthread threads. Every open SSE stream, long-poll (?wait=) and waiting OpenAI call "
    "holds one (and a Redis connection) while it waits, so this bounds how many can be open "
    "before submits and /healthz queue behind them: 500 open streams leave both under 100 ms at "
    "P99 (benchmarks/open_streams.py). An idle thread costs little.")
API_OPEN = Setting(
    "TAILGUARD_API_OPEN", False, _bool,
    "Let `tailguard api` bind a non-loopback address while no API key exists (it refuses "
    "otherwise). Only where something else guards the port: a container published to the "
    "host's loopback, an authenticating proxy.")
FLOWER_PORT = Setting("TAILGUARD_FLOWER_PORT", 5555, int, "Port of Flower.")
FLOWER_BASIC_AUTH = Setting(
    "TAILGUARD_FLOWER_BASIC_AUTH", "", str,
    "user:password for Flower's --basic-auth. Empty: a password is generated once into "
    "$TAILGUARD_HOME/flower.auth (user admin); Flower never runs without auth.")
RESTART_BACKOFF_S = Setting(
    "TAILGUARD_RESTART_BACKOFF_S", 1.0, float,
    "`tailguard up` restarts a child that exited after this many seconds, doubling with each "
    "restart within TAILGUARD_CRASH_LOOP_WINDOW_S (at most 30 s).")
CRASH_LOOP_RESTARTS = Setting(
    "TAILGUARD_CRASH_LOOP_RESTARTS", 5, int,
    "K: a child restarted this many times within TAILGUARD_CRASH_LOOP_WINDOW_S is left down "
    "(a crash loop) and `tailguard up` says why.")
CRASH_LOOP_WINDOW_S = Setting(
    "TAILGUARD_CRASH_LOOP_WINDOW_S", 300.0, float,
    "M: the window, in seconds, in which TAILGUARD_CRASH_LOOP_RESTARTS restarts make a crash loop.")
REDIS_SOCKET_TIMEOUT_S = Setting(
    "TAILGUARD_REDIS_SOCKET_TIMEOUT_S", 3.0, float,
    "Longest wait of the API and of Celery for one Redis reply (and for a connection): past it "
    "a request answers 503 with Retry-After instead of hanging while Redis is down or stopped. "
    "Must exceed TAILGUARD_SSE_HEARTBEAT_S (a stream's blocking read lasts that long).")
REDIS_PORT = Setting(
    "TAILGUARD_REDIS_PORT", 6379, int, "Port of the embedded redis-server started by `tailguard up`.")
REDIS_MAXMEMORY = Setting(
    "TAILGUARD_REDIS_MAXMEMORY", "1gb", str,
    "maxmemory of the embedded redis-server (noeviction: when full, writes fail visibly and "
    "submissions answer 503, instead of Redis silently dropping queued jobs).")
MAX_BODY_BYTES = Setting(
    "TAILGUARD_MAX_BODY_BYTES", 1 << 20, int, "Largest request body the API reads; larger is a 413.")
MAX_WAIT_S = Setting(
    "TAILGUARD_MAX_WAIT_S", 60.0, float, "Upper bound of GET /v1/jobs/<id>?wait=S.")
JOB_TTL_S = Setting(
    "TAILGUARD_JOB_TTL_S", 172800, int,
    "How long a job record (and its result) is kept after submission, in seconds. Must exceed "
    "every lane's queue_ttl_s + deadline_s + TAILGUARD_WORKER_LOST_GRACE_S (checked at load).")
WORKER_LOST_GRACE_S = Setting(
    "TAILGUARD_WORKER_LOST_GRACE_S", 30.0, float,
    "A running job with no result this long past its lane deadline is failed as worker_lost.")
REDELIVER_AFTER_S = Setting(
    "TAILGUARD_REDELIVER_AFTER_S", 30.0, float,
    "A message a worker took this long ago and never started (its job still queued) goes back on "
    "its queue: a worker that loses its broker connection forgets the messages it had reserved "
    "(tailguard/jobs/redeliver.py). Keep it above the longest pause between delivery and start (an "
    "engine restart); a copy that races the original is a no-op.")
WORKER_HEARTBEAT_S = Setting(
    "TAILGUARD_WORKER_HEARTBEAT_S", 1.5, float,
    "How often a worker refreshes its heartbeats (its process's, read by the reaper; its lanes', "
    "read by GET /healthz) and reaps dead peers; each lapses 3x this after it was written, and a "
    "dead worker's running jobs fail as worker_lost within ~5x this.")

STREAM_FLUSH_S = Setting(
    "TAILGUARD_STREAM_FLUSH_S", 0.05, float,
    "A worker batches text deltas into one Redis Stream entry per this many seconds "
    "(the first delta is written at once, so time to first token is not held back).")
STREAM_WRITES_PER_S = Setting(
    "TAILGUARD_STREAM_WRITES_PER_S", 40.0, float,
    "The stream entries per second a worker's running jobs write together, at most: with more "
    "than this x TAILGUARD_STREAM_FLUSH_S jobs running, a job starting then batches its text "
    "over (running jobs / this) seconds instead. Each entry is work for the worker, Redis and "
    "the API on the front end's core; under a burst that work is what delays new requests "
    "(docs/benchmarks.md, issue 11). 0: never stretched.")
STREAM_MAXLEN = Setting(
    "TAILGUARD_STREAM_MAXLEN", 10000, int, "Approximate cap on entries in one job's stream.")
SSE_HEARTBEAT_S = Setting(
    "TAILGUARD_SSE_HEARTBEAT_S", 2.0, float,
    "Idle SSE streams get a comment line this often; a failed write is how a disconnected "
    "client is noticed (and, where asked, its request cancelled).")

WORKER_METRICS_PORT = Setting(
    "TAILGUARD_WORKER_METRICS_PORT", 0, int,
    "Port where a worker serves Prometheus metrics (/metrics); 0 = off. `tailguard up` gives "
    "worker i the port 9101 + i.")
WORKER_METRICS_ADDR = Setting(
    "TAILGUARD_WORKER_METRICS_ADDR", "127.0.0.1", str,
    "Address the worker metrics server binds; 0.0.0.0 in containers so Prometheus can scrape it.")
STATS_RETENTION_S = Setting(
    "TAILGUARD_STATS_RETENTION_S", 86400, int,
    "How long the per-minute histograms behind `tailguard stats` are kept in Redis.")
RATE_WINDOW_S = Setting(
    "TAILGUARD_RATE_WINDOW_S", 30, int,
    "A lane's service rate is the cost tokens of its requests that finished over this many "
    "seconds, divided by it: what admission divides the lane's backlog by.")
PRIOR_TOKENS_PER_S = Setting(
    "TAILGUARD_PRIOR_TOKENS_PER_S", 20.0, float,
    "Floor of a lane's service rate per engine sequence (x max_num_seqs x live workers): used "
    "before anything was measured, and while a lightly used lane measures less than it can do. "
    "Set it near what your slowest engine sustains per sequence.")
ADMIT_WITHOUT_WORKER = Setting(
    "TAILGUARD_ADMIT_WITHOUT_WORKER", False, _bool,
    "Queue requests for a lane no live worker serves (they wait up to queue_ttl_s for one to "
    "come) instead of answering 503 no_live_worker.")
REQUEST_LOG = Setting(
    "TAILGUARD_REQUEST_LOG", "", str,
    "File for the request log (one JSON line per finished request). Empty: the API's stdout.")


ALL: tuple[Setting, ...] = tuple(v for v in dict(globals()).values() if isinstance(v, Setting))

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
#: the embedded Redis's password, generated once (mode 600), next to flower.auth
REDIS_PASSWORD_FILE = "redis.password"


def redis_url() -> str:
    """The Redis every process talks to: TAILGUARD_REDIS_URL, else the embedded one (with its
    password once `tailguard up` has made one)."""
    configured = REDIS_URL.get()
    if configured:
        return configured
    password_file = home() / REDIS_PASSWORD_FILE
    if password_file.exists():
        return f"redis://:{password_file.read_text().strip()}@127.0.0.1:{REDIS_PORT.get()}/0"
    return DEFAULT_REDIS_URL


def home() -> Path:
    return Path(HOME.get()).resolve()


if __name__ == "__main__":  # pragma: no cover - a diagnostic
    for s in ALL:
        print(f"{s.env}={s.get()!r}\n    {s.doc}")
