"""Lifecycle of one tailguard worker process: its lanes, its engine, its heartbeat.

A worker serves the lanes it consumes (`-Q short` or `-Q long,batch`). It hosts
one EngineHost built from those lanes' engine settings, started once the
consumer is ready and shut down on worker_shutdown (without that a warm
shutdown hangs on vLLM's engine-core process). While the engine is up, the
worker refreshes a heartbeat per lane in Redis, which is what GET /healthz reads.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import redis
from celery import signals
from celery.worker.control import inspect_command

from tailguard import settings
from tailguard.errors import EngineDeadError
from tailguard.jobs import EXPIRED, QUEUED, JobStore
from tailguard.lanes import Lane, LaneTable, check_worker_lanes, engine_settings_for, load_lanes
from tailguard.modelinfo import model_max_len, serving_dtype

log = logging.getLogger("tailguard.worker")


@dataclass
class WorkerContext:
    """Everything one worker process owns; built once, when its consumer is ready."""

    hostname: str
    lanes: list[Lane]
    store: JobStore
    engine: Any  # tailguard.engine.EngineHost (imported lazily: it pulls in vLLM)
    engine_error: BaseException | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    stopping: threading.Event = field(default_factory=threading.Event)

    @property
    def lane_names(self) -> list[str]:
        return [l.name for l in self.lanes]

    def start_engine(self) -> None:
        """Start the engine (idempotent; blocks until it is up or has failed)."""
        try:
            self.engine.start()
        except BaseException as exc:  # noqa: BLE001 - reported to every task and to healthz
            self.engine_error = exc
            log.exception("engine failed to start; this worker will fail its tasks")
        finally:
            self.ready.set()

    def ready_engine(self):
        """The started engine, for a task about to generate; starts it if nobody has."""
        if not self.engine.started and self.engine_error is None:
            self.start_engine()
        self.ready.wait()
        if self.engine_error is not None:
            raise EngineDeadError(f"the engine failed to start: {self.engine_error}")
        return self.engine


_context: WorkerContext | None = None
_context_lock = threading.Lock()


def current() -> WorkerContext:
    if _context is None:
        raise RuntimeError("tailguard worker context is not set up: is this a tailguard worker?")
    return _context


def setup(hostname: str, queue_names: list[str], *, eager_engine: bool = True) -> WorkerContext:
    """Build this process's context for the lanes behind `queue_names`.

    With eager_engine the engine starts now, in the background, and the lanes are
    advertised to /healthz once it is up; otherwise it starts with the first task
    that needs it (the integration tests use this to run a real worker with no engine).
    """
    global _context
    lanes = _lanes_for_queue_names(load_lanes(), queue_names)
    with _context_lock:
        if _context is not None:
            return _context
        ctx = _context = WorkerContext(hostname=hostname, lanes=lanes, store=make_store(),
                                       engine=build_engine(lanes))
    _serve_metrics(ctx)
    if eager_engine:
        threading.Thread(target=ctx.start_engine, name="tailguard-engine-start", daemon=True).start()
    else:
        ctx.ready.set()
    threading.Thread(target=_heartbeat_loop, args=(ctx,), name="tailguard-heartbeat",
                     daemon=True).start()
    return ctx


def make_store() -> JobStore:
    client = redis.Redis.from_url(settings.redis_url(), socket_connect_timeout=5,
                                  health_check_interval=30)
    return JobStore(client, ttl_s=settings.JOB_TTL_S.get(),
                    worker_lost_grace_s=settings.WORKER_LOST_GRACE_S.get(),
                    stream_maxlen=settings.STREAM_MAXLEN.get())


def build_engine(lanes: list[Lane]):
    """The EngineHost for a worker serving `lanes` (largest batch and context among them)."""
    from tailguard.engine import EngineConfig, EngineHost

    model = settings.MODEL.get()
    if not model:
        raise RuntimeError("TAILGUARD_MODEL is not set: point it at a model directory or a "
                           "Hugging Face id (`tailguard make-demo-model DIR` builds a demo one)")
    max_num_seqs, max_len = engine_settings_for(lanes)
    limit = model_max_len(model)
    if limit is not None:
        max_len = min(max_len, limit)
    return EngineHost(EngineConfig(model=model, max_num_seqs=max_num_seqs, max_model_len=max_len,
                                   dtype=serving_dtype(model, settings.DTYPE.get())))


def _serve_metrics(ctx: WorkerContext) -> None:
    """This worker's Prometheus endpoint: its engine host's view, and vLLM's own `vllm:*`
    metrics, which vLLM registers in this process's default registry."""
    port = settings.WORKER_METRICS_PORT.get()
    if not port:
        return
    from prometheus_client import REGISTRY, start_http_server

    from tailguard.metrics import WorkerCollector

    REGISTRY.register(WorkerCollector(ctx.hostname, ctx.engine.stats))
    addr = settings.WORKER_METRICS_ADDR.get()
    start_http_server(port, addr=addr)
    log.info("metrics on http://%s:%d/metrics", addr, port)


def _lanes_for_queue_names(table: LaneTable, names: list[str]) -> list[Lane]:
    lanes = table.lanes_for_queues(names)
    check_worker_lanes(lanes)
    return lanes


# --- signals ---------------------------------------------------------------------------

@signals.celeryd_init.connect
def _set_concurrency(sender=None, conf=None, options=None, **_: Any) -> None:
    """`celery -A tasks worker -Q short`: run as many threads as the lane batches requests."""
    options = options or {}
    queues = options.get("queues")
    if not queues or options.get("concurrency"):
        return
    names = queues.split(",") if isinstance(queues, str) else list(queues)
    lanes = _lanes_for_queue_names(load_lanes(), [n.strip() for n in names if n.strip()])
    conf.worker_concurrency = engine_settings_for(lanes)[0]


@signals.worker_ready.connect
def _on_worker_ready(sender=None, **_: Any) -> None:
    """Set up from the queues this worker actually consumes, then start the engine."""
    setup(sender.hostname, [q.name for q in sender.task_consumer.queues])


def _heartbeat_loop(ctx: WorkerContext) -> None:
    """Advertise the lanes as served while the engine is up (read by GET /healthz)."""
    ctx.ready.wait()
    period = settings.WORKER_HEARTBEAT_S.get()
    while ctx.engine_error is None and not ctx.stopping.is_set():
        try:
            ctx.store.heartbeat(ctx.lane_names, ctx.hostname, ttl_s=period * 3)
        except redis.RedisError as exc:
            log.warning("heartbeat failed: %s", exc)
        ctx.stopping.wait(period)


@signals.task_revoked.connect
def _on_revoked(request=None, expired: bool = False, **_: Any) -> None:
    """Celery drops a message whose `expires` passed before it was received: record why."""
    if expired and _context is not None and request is not None:
        _context.store.transition(
            request.id, {QUEUED}, EXPIRED,
            {"error": {"code": "expired",
                       "message": "the request waited in its lane's queue past queue_ttl_s"}})


@signals.worker_shutdown.connect
def _on_worker_shutdown(**_: Any) -> None:
    teardown()


def teardown() -> None:
    """Withdraw the heartbeat and shut the engine down (idempotent)."""
    global _context
    with _context_lock:
        ctx, _context = _context, None
    if ctx is None:
        return
    ctx.stopping.set()
    try:
        ctx.store.forget_worker(ctx.lane_names, ctx.hostname)
    except redis.RedisError:
        pass
    ctx.engine.shutdown()


# --- remote control: `celery -A tasks inspect engine_stats` ------------------------------

@inspect_command()
def engine_stats(state, **_: Any) -> dict:
    """What this worker's engine host observed: in-flight, peak, aborted, still unfinished."""
    ctx = _context
    if ctx is None:
        return {"ready": False}
    stats = ctx.engine.stats() if ctx.engine.started else {}
    return {"ready": ctx.ready.is_set() and ctx.engine_error is None, "lanes": ctx.lane_names,
            "pid": os.getpid(), **stats}
