"""Lifecycle of one tailguard worker process: its lanes, its engine, its heartbeat.

A worker serves the lanes it consumes (`-Q short` or `-Q long,batch`). Once its
consumer is ready it builds a WorkerRuntime and attaches it to the Celery app,
where the tasks reach it (`WorkerRuntime.of(task.app)`). The runtime hosts one
EngineHost built from those lanes' engine settings: it starts the engine, runs a
warm-up on it (tailguard/warmup.py), and only then advertises the lanes in Redis
with a heartbeat, which is what GET /healthz reads. An engine that fails to start
or to warm up makes the worker exit non-zero instead of serving. worker_shutdown
shuts the engine down: without that a warm shutdown hangs on vLLM's engine-core
process.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis
from celery import Celery, signals
from celery.platforms import EX_FAILURE
from celery.worker import state as worker_state
from celery.worker.control import inspect_command

from tailguard import settings
from tailguard.errors import EngineDeadError
from tailguard.jobs import JobStore
from tailguard.lanes import Lane, LaneTable, check_worker_lanes, engine_settings_for, load_lanes
from tailguard.liveness import Liveness
from tailguard.modelinfo import model_max_len, serving_dtype
from tailguard.runner import JobRunner
from tailguard.stream import DeltaWriter

if TYPE_CHECKING:  # tailguard.engine's users import vLLM only when an engine starts
    from tailguard.engine import EngineHost

log = logging.getLogger("tailguard.worker")

#: The attribute of the Celery app that holds this process's WorkerRuntime.
_APP_ATTR = "tailguard_runtime"


@dataclass
class WorkerRuntime:
    """Everything one worker process owns; built once, when its consumer is ready."""

    app: Celery
    hostname: str
    lanes: list[Lane]
    store: JobStore
    liveness: Liveness
    engine: EngineHost
    #: True for a real worker: an engine that cannot serve stops the process non-zero.
    exit_on_engine_failure: bool = False
    engine_error: BaseException | None = None
    #: Set once the lanes may be advertised: the engine is warm, failed, or starts lazily.
    ready: threading.Event = field(default_factory=threading.Event)
    stopping: threading.Event = field(default_factory=threading.Event)
    runner: JobRunner = field(init=False)
    _start_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _warm: bool = False

    def __post_init__(self) -> None:
        self.runner = JobRunner(self.ready_engine, self.store, self._writer_for, self.hostname)

    @staticmethod
    def of(app: Celery) -> WorkerRuntime:
        """The runtime of this worker process, for a task of `app`."""
        runtime = attached(app)
        if runtime is None:
            raise RuntimeError("tailguard worker runtime is not set up: is this a tailguard worker?")
        return runtime

    @property
    def lane_names(self) -> list[str]:
        return [l.name for l in self.lanes]

    def start_engine(self) -> None:
        """Start the engine and warm it up, once: later and concurrent callers wait for
        that one attempt (a task must not run, nor warm up again, beside it)."""
        from tailguard.tokens import PromptCounter
        from tailguard.warmup import exact_length_prompts, failure_message, warm_up

        config = self.engine.config
        with self._start_lock:
            if self._warm or self.engine_error is not None:
                return
            try:
                self.engine.start()
                log.info("%s", warm_up(self.engine,
                                       exact_length_prompts(PromptCounter(config.model))).describe())
                self._warm = True
            except BaseException as exc:  # noqa: BLE001 - reported to every task and to the log
                self.engine_error = exc
                if self.exit_on_engine_failure:
                    # Before the waiting tasks fail: they must not ask for a second shutdown.
                    self.stopping.set()
                    log.critical("%s", failure_message(config.model, config.dtype, exc))
                    _exit_worker()
                else:
                    log.exception("engine failed to start; this worker will fail its tasks")
            finally:
                self.ready.set()

    def ready_engine(self) -> EngineHost:
        """The started, warmed-up engine, for a task about to generate; starts it if nobody has."""
        self.start_engine()
        if self.engine_error is not None:
            raise EngineDeadError(f"the engine failed to start: {self.engine_error}")
        return self.engine

    def stop_worker(self) -> None:
        """The engine died under a task: stop this worker so it can be restarted."""
        if self.stopping.is_set():
            return
        log.critical("engine is dead; stopping this worker so it can be restarted")
        self.app.control.shutdown(destination=[self.hostname])

    def _writer_for(self, job_id: str) -> DeltaWriter:
        return DeltaWriter(self.store.redis, job_id, flush_s=settings.STREAM_FLUSH_S.get(),
                           maxlen=self.store.stream_maxlen, ttl_s=self.store.ttl_s)


_attach_lock = threading.Lock()


def attached(app: Celery) -> WorkerRuntime | None:
    """The runtime attached to `app`, if this process is a set-up tailguard worker."""
    return getattr(app, _APP_ATTR, None)


def setup(app: Celery, hostname: str, queue_names: list[str], *,
          eager_engine: bool = True) -> WorkerRuntime:
    """Build this process's runtime for the lanes behind `queue_names` and attach it to `app`.

    With eager_engine the engine starts and warms up now, in the background, and the
    lanes are advertised to /healthz once it has (or the worker exits non-zero if it
    cannot); otherwise it starts with the first task that needs it (the integration
    tests use this to run a real worker with no engine).
    """
    lanes = _lanes_for_queue_names(load_lanes(), queue_names)
    with _attach_lock:
        runtime = attached(app)
        if runtime is not None:
            return runtime
        client = redis.Redis.from_url(settings.redis_url(), socket_connect_timeout=5,
                                      health_check_interval=30)
        store = JobStore.from_settings(client)
        runtime = WorkerRuntime(app=app, hostname=hostname, lanes=lanes, store=store,
                                liveness=Liveness(client), engine=build_engine(lanes),
                                exit_on_engine_failure=eager_engine)
        setattr(app, _APP_ATTR, runtime)
    _serve_metrics(runtime)
    if eager_engine:
        threading.Thread(target=runtime.start_engine, name="tailguard-engine-start",
                         daemon=True).start()
    else:
        runtime.ready.set()
    threading.Thread(target=_heartbeat_loop, args=(runtime,), name="tailguard-heartbeat",
                     daemon=True).start()
    return runtime


def build_engine(lanes: list[Lane]) -> EngineHost:
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


def teardown(app: Celery) -> None:
    """Withdraw the heartbeat, shut the engine down and detach the runtime (idempotent)."""
    with _attach_lock:
        runtime = attached(app)
        if runtime is None:
            return
        setattr(app, _APP_ATTR, None)
    runtime.stopping.set()
    try:
        runtime.liveness.forget(runtime.lane_names, runtime.hostname)
    except redis.RedisError:
        pass
    runtime.engine.shutdown()


def _exit_worker() -> None:
    """A warm shutdown that ends the process with EX_FAILURE: the consumer loop polls this
    flag (Celery's own SIGTERM handler sets it the same way) and worker_shutdown follows."""
    worker_state.should_stop = EX_FAILURE


def _serve_metrics(runtime: WorkerRuntime) -> None:
    """This worker's Prometheus endpoint: its engine host's view, and vLLM's own `vllm:*`
    metrics, which vLLM registers in this process's default registry."""
    port = settings.WORKER_METRICS_PORT.get()
    if not port:
        return
    from prometheus_client import REGISTRY, start_http_server

    from tailguard.metrics import WorkerCollector

    REGISTRY.register(WorkerCollector(runtime.hostname, runtime.engine.stats))
    addr = settings.WORKER_METRICS_ADDR.get()
    start_http_server(port, addr=addr)
    log.info("metrics on http://%s:%d/metrics", addr, port)


def _lanes_for_queue_names(table: LaneTable, names: list[str]) -> list[Lane]:
    lanes = table.lanes_for_queues(names)
    check_worker_lanes(lanes)
    return lanes


def _heartbeat_loop(runtime: WorkerRuntime) -> None:
    """Advertise the lanes as served once the engine is up and warm (read by GET /healthz)."""
    runtime.ready.wait()
    period = settings.WORKER_HEARTBEAT_S.get()
    while runtime.engine_error is None and not runtime.stopping.is_set():
        try:
            runtime.liveness.heartbeat(runtime.lane_names, runtime.hostname, ttl_s=period * 3)
        except redis.RedisError as exc:
            log.warning("heartbeat failed: %s", exc)
        runtime.stopping.wait(period)


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
    """Set up from the queues this worker actually consumes, then start the engine.

    Celery logs and swallows a signal handler's exception, which would leave a worker
    consuming with nothing to run its tasks: a worker that cannot set up exits instead.
    """
    try:
        setup(sender.app, sender.hostname, [q.name for q in sender.task_consumer.queues])
    except Exception:
        log.critical("this worker cannot set up, so it exits", exc_info=True)
        _exit_worker()


@signals.task_revoked.connect
def _on_revoked(sender=None, request=None, expired: bool = False, **_: Any) -> None:
    """Celery drops a message whose `expires` passed before it was received: record why."""
    runtime = attached(sender.app) if sender is not None else None
    if expired and runtime is not None and request is not None:
        runtime.runner.expire(request.id, only_if_overdue=False)


@signals.worker_shutdown.connect
def _on_worker_shutdown(sender=None, **_: Any) -> None:
    teardown(sender.app)


# --- remote control: `celery -A tasks inspect engine_stats` ------------------------------

@inspect_command()
def engine_stats(state, **_: Any) -> dict:
    """What this worker's engine host observed: in-flight, peak, aborted, still unfinished."""
    runtime = attached(state.consumer.app)
    if runtime is None:
        return {"ready": False}
    return {"ready": runtime.ready.is_set() and runtime.engine_error is None,
            "lanes": runtime.lane_names, "pid": os.getpid(), **runtime.engine.stats().to_dict()}
