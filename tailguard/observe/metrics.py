"""Prometheus metrics: names prefixed `tailguard_`, label `lane`, vLLM's names where one exists.

Who exports what (each process serves only what it owns; Prometheus sums):

* the API (`GET /metrics` on the API port) owns per-lane request histograms and
  counters, fed by the finished-request stream (tailguard/jobs/finished.py) so every
  request is counted once, by one consumer, whichever process ended it; plus
  accepted/capped/rejected counts at submission, and queue depth and backlog
  tokens (the series workers scale by) read from Redis at scrape time. The API
  runs one gunicorn process (with threads), so one in-process registry is the
  whole truth; if you run several API processes, scrape each (the finished
  stream's consumer group still counts each request once).
* each worker (`--metrics-port`, `TAILGUARD_WORKER_METRICS_PORT`) owns its engine:
  running and peak running requests, aborts, and vLLM's own `vllm:*` metrics
  (KV-cache use, scheduler queues, latency histograms), which vLLM registers in the worker
  process and which are served with the worker's and its lanes' labels
  (tailguard/observe/vllm_series.py).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import redis
from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Histogram,
    make_wsgi_app,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from tailguard.engine.stats import HostStats
from tailguard.errors import RateLimited
from tailguard.jobs.finished import FinishedRequest
from tailguard.jobs.lane_load import LaneLoadStore
from tailguard.jobs.redis_memory import StorageWatch
from tailguard.jobs.store import held_count

log = logging.getLogger("tailguard.metrics")

PREFIX = "tailguard"

# Buckets as vLLM's own histograms (seconds and tokens), so dashboards compare like with like.
_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                    7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_TPOT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                 1.0, 2.5, 5.0, 10.0)
_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000)

#: distinct `field` labels of tailguard_openai_ignored_fields_total per process: the names come
#: from clients, so past these they count under UNLISTED_FIELD (a scrape stays bounded)
MAX_IGNORED_FIELD_LABELS = 64
UNLISTED_FIELD = "_unlisted"
#: the form of a field name that gets a label of its own (others count as "other")
_FIELD_LABEL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")
_MAX_FIELD_LABEL_LEN = 40

# Redis priority sub-queues kombu creates for a queue (priority_steps [0, 3, 6, 9]).
_PRIORITY_SUFFIXES = ("", "\x06\x163", "\x06\x166", "\x06\x169")


def metric_name(name: str) -> str:
    """`tailguard_<name>`: the one way a metric is named."""
    if not name.replace("_", "").isalnum() or name != name.lower():
        raise ValueError(f"bad metric name {name!r}")
    return f"{PREFIX}_{name}"


def queue_depth(client: redis.Redis, lane_queue: str, lane: str | None = None) -> int:
    """Messages waiting in a lane's queue, all priority sub-queues together, and those held in
    front of it in fair order by key (`lane`'s held lists: tailguard/redis/lua/fair_release.lua)."""
    pipe = client.pipeline(transaction=False)
    for suffix in _PRIORITY_SUFFIXES:
        pipe.llen(lane_queue + suffix)
    depth = sum(pipe.execute())
    return depth if lane is None else depth + held_count(client, lane)


class QueueDepthCollector(Collector):
    """`tailguard_queue_depth{lane}`, read from Redis when scraped."""

    def __init__(self, client: redis.Redis, lanes: list[str]) -> None:
        self.client, self.lanes = client, lanes

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily(metric_name("queue_depth"),
                                   "Requests waiting in the lane's queue (all priorities, "
                                   "and held in fair order)",
                                   labels=["lane"])
        try:
            for lane in self.lanes:
                family.add_metric([lane], queue_depth(self.client, lane, lane))
        except redis.RedisError:
            return  # no sample beats a wrong one; /healthz reports the outage
        yield family


class LaneBacklogCollector(Collector):
    """`tailguard_lane_backlog_tokens{lane}`: the cost tokens of the lane's queued jobs, read
    from Redis when scraped (tailguard/jobs/lane_load.py), what admission decides on. The series
    to scale workers by: a short and a long job differ tens of times in cost, so a count of
    jobs (tailguard_queue_depth) says little about the engines they need. Every API process
    exports the same value: aggregate with max, not sum (deploy/kubernetes/base/scaling.yaml)."""

    def __init__(self, client: redis.Redis, lanes: list[str]) -> None:
        self.load, self.lanes = LaneLoadStore(client), lanes

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily(metric_name("lane_backlog_tokens"),
                                   "Cost tokens (prompt + max_tokens) of the lane's queued jobs",
                                   labels=["lane"])
        try:
            for lane in self.lanes:
                family.add_metric([lane], self.load.load(lane).backlog_tokens)
        except redis.RedisError:
            return  # no sample beats a wrong one; /readyz reports the outage
        yield family


class PrefixOfferCollector(Collector):
    """`tailguard_prefix_offers_total{outcome}`: requests offered to the worker that served their
    prefix lately (made), started by it (taken), or moved to their lane's queue past the offer's
    wait (given_up), read from Redis when scraped (tailguard/jobs/prefix_index.py): every API
    process exports the same totals (aggregate with max)."""

    def __init__(self, outcomes: Callable[[], dict[str, int]]) -> None:
        self.outcomes = outcomes

    def collect(self) -> Iterable[CounterMetricFamily]:
        try:
            counts = self.outcomes()
        except redis.RedisError:
            return  # no sample beats a wrong one
        family = CounterMetricFamily(metric_name("prefix_offers"),
                                     "Prefix-affinity offers by outcome: made, taken by the "
                                     "preferred worker, given up (moved to the lane's queue)",
                                     labels=["outcome"])
        for outcome in ("made", "taken", "given_up"):
            family.add_metric([outcome], counts.get(outcome, 0))
        yield family


class StorageCollector(Collector):
    """Redis's memory and keys, read when scraped, named as redis_exporter names them
    (``redis_memory_used_bytes``, ``redis_db_keys{db}``...) under the tailguard_ prefix, and
    the high-water mark past which submissions answer 503 storage_full
    (tailguard/jobs/redis_memory.py)."""

    def __init__(self, storage: StorageWatch) -> None:
        self.storage = storage

    def collect(self) -> Iterable[GaugeMetricFamily]:
        try:
            memory = self.storage.read()
            keyspace = self.storage.client.info("keyspace")
        except redis.RedisError:
            return  # no sample beats a wrong one; /healthz reports the outage
        for name, doc, value in (
                ("redis_memory_used_bytes", "Redis's used_memory (what maxmemory bounds)",
                 memory.used_bytes),
                ("redis_memory_max_bytes", "Redis's maxmemory (0: none)", memory.max_bytes),
                ("redis_memory_high_water_bytes", "Past this used_memory submissions answer 503 "
                 "storage_full (TAILGUARD_REDIS_HIGH_WATER x maxmemory; 0: never)",
                 memory.high_water_bytes),
                ("storage_full", "1 while submissions are refused as storage_full", int(memory.full))):
            yield GaugeMetricFamily(metric_name(name), doc, value=value)
        keys_total = GaugeMetricFamily(metric_name("redis_db_keys"), "Keys in the Redis database",
                                       labels=["db"])
        expiring = GaugeMetricFamily(metric_name("redis_db_keys_expiring"),
                                     "Keys with a TTL in the Redis database", labels=["db"])
        for db, counts in sorted(keyspace.items()):
            if isinstance(counts, dict):
                keys_total.add_metric([db], counts.get("keys", 0))
                expiring.add_metric([db], counts.get("expires", 0))
        yield keys_total
        yield expiring


class GatewayMetrics:
    """The API's metrics, in a registry of their own (one per app)."""

    def __init__(self, lanes: list[str], client: redis.Redis | None = None, *,
                 key_names: bool = False) -> None:
        #: label per-key samples with the key's name (TAILGUARD_METRICS_KEY_NAMES), else its id
        self.key_names = key_names
        self.registry = CollectorRegistry()
        self._storage_watched = False
        r = self.registry
        by_lane = ["lane"]
        self.queue_time = Histogram(metric_name("request_queue_time_seconds"),
                                    "Submission to start on a worker", by_lane,
                                    buckets=_LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram(metric_name("time_to_first_token_seconds"),
                              "Submission to first token (queue wait + engine TTFT)", by_lane,
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram(metric_name("time_per_output_token_seconds"),
                              "Engine time per output token after the first", by_lane,
                              buckets=_TPOT_BUCKETS, registry=r)
        self.e2e = Histogram(metric_name("e2e_request_latency_seconds"),
                             "Submission to the end of the request", by_lane,
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Histogram(metric_name("request_prompt_tokens"), "Prompt tokens",
                                       by_lane, buckets=_TOKEN_BUCKETS, registry=r)
        self.generation_tokens = Histogram(metric_name("request_generation_tokens"),
                                           "Output tokens", by_lane, buckets=_TOKEN_BUCKETS,
                                           registry=r)
        self.finished = Counter(metric_name("requests"), "Finished requests by final status",
                                ["lane", "status"], registry=r)
        self.accepted = Counter(metric_name("requests_accepted"), "Requests accepted and queued",
                                by_lane, registry=r)
        self.capped = Counter(metric_name("requests_capped"),
                              "Requests whose max_tokens was clamped to the lane cap", by_lane,
                              registry=r)
        self.rejected = Counter(metric_name("requests_rejected"),
                                "Requests refused before queueing, by error code", ["code"],
                                registry=r)
        self.refused = Counter(metric_name("requests_refused"),
                               "Requests a lane refused at admission (429 lane_full, wait_too_long; "
                               "503 no_live_worker), by code", ["lane", "code"], registry=r)
        self.by_key = Counter(metric_name("api_key_requests"),
                              "Submissions by API key (its name, or the first 12 hex digits of its "
                              "sha256): accepted, or the refusal's code", ["key", "result"],
                              registry=r)
        self.openai_ignored = Counter(
            metric_name("openai_ignored_fields"), "Unknown fields in OpenAI request bodies, "
            "ignored as vLLM ignores them, by endpoint and field name (names past the first "
            f"{MAX_IGNORED_FIELD_LABELS}, and odd ones, as {UNLISTED_FIELD})", ["endpoint", "field"],
            registry=r)
        self._ignored_labels: set[str] = set()
        for lane in lanes:  # so every lane shows up (as 0) before its first request
            self.accepted.labels(lane)
            self.capped.labels(lane)
        if client is not None:
            r.register(QueueDepthCollector(client, lanes))
            r.register(LaneBacklogCollector(client, lanes))

    def observe(self, rec: FinishedRequest) -> None:
        """A FinishedConsumer sink."""
        lane = rec.lane or "unknown"
        self.finished.labels(lane, rec.status).inc()
        for hist, value in ((self.queue_time, rec.queued_s), (self.ttft, rec.ttft_s),
                            (self.tpot, rec.tpot_s), (self.e2e, rec.e2e_s),
                            (self.prompt_tokens, rec.prompt_tokens),
                            (self.generation_tokens, rec.completion_tokens)):
            if value is not None:
                hist.labels(lane).observe(value)

    def watch_storage(self, storage: StorageWatch) -> None:
        """Export Redis's memory and keys (StorageCollector), once per registry."""
        if not self._storage_watched:
            self.registry.register(StorageCollector(storage))
            self._storage_watched = True

    def watch_offers(self, outcomes: Callable[[], dict[str, int]]) -> None:
        """Export prefix affinity's offers (PrefixOfferCollector: prefix affinity is on)."""
        self.registry.register(PrefixOfferCollector(outcomes))

    def key_label(self, name: str, key_id: str) -> str:
        """What the `key` label says of a key: its name only when asked to (/metrics needs no
        key, so by default it names no team), else its id as `tailguard keys list` shows it."""
        return name if self.key_names else key_id[:12]

    def on_accepted(self, lane: str, capped: bool, key: str | None = None) -> None:
        self.accepted.labels(lane).inc()
        if capped:
            self.capped.labels(lane).inc()
        if key is not None:
            self.by_key.labels(key, "accepted").inc()

    def on_ignored_fields(self, endpoint: str, fields: Iterable[str]) -> None:
        """Unknown fields a client sent to an OpenAI endpoint (`endpoint`: chat, completion)."""
        for name in fields:
            self.openai_ignored.labels(endpoint, self._ignored_label(name)).inc()

    def _ignored_label(self, name: str) -> str:
        if name in self._ignored_labels:
            return name
        if (len(self._ignored_labels) >= MAX_IGNORED_FIELD_LABELS or not name
                or len(name) > _MAX_FIELD_LABEL_LEN or not set(name) <= _FIELD_LABEL_CHARS):
            return UNLISTED_FIELD
        self._ignored_labels.add(name)
        return name

    def on_refused(self, lane: str | None, code: str, key: str | None = None) -> None:
        """A refusal at admission (per lane) or by the key's own limits (per key only; `lane`
        None when it came before placement). `key`: its `key_label`."""
        if key is not None:
            self.by_key.labels(key, code).inc()
        if lane is not None and code != RateLimited.code:
            self.refused.labels(lane, code).inc()


class WorkerCollector(Collector):
    """A worker's engine, as its host observes it."""

    def __init__(self, worker: str, stats: Callable[[], HostStats]) -> None:
        self.worker, self.stats = worker, stats

    def collect(self):
        # HostStats is a snapshot of plain counters: a scrape never waits on the engine loop.
        s = self.stats()
        for name, doc, key in (
                ("worker_running_requests", "Requests inside the engine now", "in_flight"),
                ("worker_peak_running_requests", "Most requests inside the engine at once",
                 "peak_in_flight")):
            g = GaugeMetricFamily(metric_name(name), doc, labels=["worker"])
            g.add_metric([self.worker], getattr(s, key))
            yield g
        for name, doc, key in (
                ("worker_aborted_requests", "Requests aborted in the engine (deadline, cancel)",
                 "aborted"),
                ("worker_completed_requests", "Requests the engine finished", "completed")):
            c = CounterMetricFamily(metric_name(name), doc, labels=["worker"])
            c.add_metric([self.worker], getattr(s, key))
            yield c


#: a probe: whether the process is alive, and the JSON body that says why
Probe = Callable[[], tuple[bool, dict[str, Any]]]


class MetricsServer:
    """A worker's Prometheus endpoint on its own HTTP thread: `collectors` (a worker's include
    vLLM's own series, relabelled: tailguard/observe/vllm_series.py) and the process's CPU,
    memory and GC series, from a registry of its own, not the default one, where vLLM's
    series stand without the worker's labels. With `livez`, GET /livez answers 200 or 503 with
    its body (an orchestrator's liveness probe: tailguard/worker/probe.py); every other path
    is the metrics, as prometheus_client serves them."""

    def __init__(self, port: int, addr: str, collectors: list[Collector],
                 livez: Probe | None = None) -> None:
        self.port, self.addr, self.collectors, self.livez = port, addr, collectors, livez
        self.registry = CollectorRegistry()
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR, *collectors):
            self.registry.register(collector)
        self._server: WSGIServer | None = None

    def start(self) -> None:
        metrics = make_wsgi_app(self.registry)
        livez = self.livez

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            if livez is None or environ.get("PATH_INFO") != "/livez":
                return metrics(environ, start_response)
            alive, body = livez()
            data = json.dumps(body).encode()
            start_response("200 OK" if alive else "503 Service Unavailable",
                           [("Content-Type", "application/json"),
                            ("Content-Length", str(len(data)))])
            return [data]

        class Server(ThreadingWSGIServer):  # IPv4 or IPv6, as the address is
            address_family = socket.getaddrinfo(self.addr, self.port)[0][0]

        self._server = make_server(self.addr, self.port, app, Server, handler_class=_Quiet)
        threading.Thread(target=self._server.serve_forever, name="tailguard-metrics",
                         daemon=True).start()
        log.info("metrics on http://%s:%d/metrics", self.addr, self.port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _Quiet(WSGIRequestHandler):
    """No access log: Prometheus and the kubelet ask every few seconds."""

    def log_message(self, format: str, *args: Any) -> None:
        pass
