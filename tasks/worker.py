"""Lifecycle of one tailguard worker process: its lanes, its engine, its heartbeat.

A worker serves the lanes it consumes (`-Q short` or `-Q long,batch`). Once its
consumer is ready it builds a WorkerRuntime and attaches it to the Celery app,
where the tasks reach it (`WorkerRuntime.of(task.app)`). The runtime hosts one
EngineHost built from those lanes' engine settings: it starts the engine, runs a
warm-up on it (tailguard/warmup.py), and only then advertises the lanes in Redis
with a heartbeat, which is what GET /healthz reads. An engine that dies is restarted
in-process (tailguard/engine_keeper.py): the lanes are withdrawn from /healthz at
once and advertised again once the new engine has warmed up. An engine that fails
its first start or warm-up, or does not come back after a death, makes the worker
exit non-zero instead of serving. The worker's own heartbeat runs from setup on,
engine up or not, and every heartbeat also reaps the running jobs of dead peers
(tailguard/reaper.py). A worker whose [[workers]] entry borrows from other lanes
also runs a borrower thread (tailguard/borrower.py) that takes their jobs while its
own lanes are idle. worker_shutdown shuts the engine down: without that a warm
shutdown hangs on vLLM's engine-core process.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import redis
from celery import Celery, signals
from celery.platforms import EX_FAILURE
from celery.worker import state as worker_state
from celery.worker.control import inspect_command

from tailguard import redis_client, settings
from tailguard.borrower import BORROWED_PRIORITY, Borrower, Prioritized
from tailguard.borrowing import BorrowPolicy, engine_for
from tailguard.engine_keeper import IDLE, SERVING, EngineKeeper
from tailguard.jobs import JobStore
from tailguard.lanes import Lane, LaneTable, check_worker_lanes, engine_settings_for, load_lanes
from tailguard.liveness import Liveness
from tailguard.modelinfo import model_max_len, serving_dtype
from tailguard.pinning import Pinning, device_kind, idle_priority, normal_priority_threads
from tailguard.reaper import LAPSE_PERIODS, Reaper
from tailguard.redeliver import Redeliverer
from tailguard.roaming import EngineCoreRoamer, roamer_for
from tailguard.runner import GenerationJob, JobRunner
from tailguard.stream import DeltaWriter, flush_interval

if TYPE_CHECKING:  # tailguard.engine's users import vLLM only when an engine starts
    from tailguard.engine import EngineConfig, EngineHost
    from tailguard.engine_stats import HostStats

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
    #: builds a fresh (unstarted) EngineHost for these lanes: the first, and each restart's
    build_engine: Callable[[], EngineHost]
    #: what it may take from other lanes while its own are idle (nothing by default), and
    #: those lanes
    borrow: BorrowPolicy = BorrowPolicy(lanes=())
    borrowed_lanes: list[Lane] = field(default_factory=list)
    #: builds the engine borrowed jobs run on when borrow.engine is "idle" (the first and
    #: each restart's); it runs at idle CPU priority (`idle_priority`)
    build_idle_engine: Callable[[], EngineHost] | None = None
    stopping: threading.Event = field(default_factory=threading.Event)
    keeper: EngineKeeper[EngineHost] = field(init=False)
    runner: JobRunner = field(init=False)
    borrower: Borrower | None = field(init=False)
    idle_keeper: EngineKeeper[EngineHost] | None = field(init=False)
    #: moves the engine's engine-core process onto idle front-end cores (CPU hosts)
    roamer: EngineCoreRoamer | None = None
    #: held while the lanes' heartbeat is written or withdrawn, so a heartbeat in progress
    #: never re-advertises an engine that has just died
    _advert_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.keeper = EngineKeeper(self.build_engine, self._warm_up, on_up=self.advertise,
                                   on_down=self.withdraw, on_give_up=self._give_up)
        self.runner = JobRunner(self.ready_engine, self.store, self._writer_for, self.hostname,
                                engine_died=self.keeper.died)
        self.borrower = self.idle_keeper = None
        if not self.borrow.lanes:
            return
        if self.build_idle_engine is not None:
            build = self.build_idle_engine

            def build_idle() -> EngineHost:  # runs on the thread that then starts it
                idle_priority()
                return build()

            idle = self.idle_keeper = EngineKeeper(
                build_idle, lambda engine: normal_priority_threads(),
                on_give_up=lambda exc: log.error("the idle engine for borrowed jobs cannot "
                                                 "serve; borrowing stops: %s", exc))
            borrowed_runner = JobRunner(idle.get, self.store, self._writer_for, self.hostname,
                                        engine_died=idle.died)
        else:
            idle = None
            borrowed_runner = JobRunner(
                lambda: Prioritized(self.ready_engine(), BORROWED_PRIORITY), self.store,
                self._writer_for, self.hostname,
                engine_died=lambda engine: self.keeper.died(engine.host))

        def serving() -> bool:
            return (self.keeper.state == SERVING and not self.stopping.is_set()
                    and (idle is None or idle.state == SERVING))

        self.borrower = Borrower(
            self.borrow, self.lane_names, max(l.max_num_seqs for l in self.lanes),
            borrowed_runner, connect=self.app.connection_for_read, publish=self._publish,
            in_flight=self.running_jobs, serving=serving)

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

    @property
    def engine(self) -> EngineHost | None:
        """The latest engine host (serving, starting or dead); None before the first start."""
        return self.keeper.host

    @property
    def serving(self) -> bool:
        """Whether /healthz may count this worker: its engine is up and warm, or (a worker
        set up without eager_engine) will start with the first task."""
        return self.keeper.state in (SERVING, IDLE) and not self.stopping.is_set()

    def engine_core_pid(self) -> int | None:
        """The own engine's vLLM engine-core process, while it is up (the roamer moves it)."""
        engine = self.keeper.host
        return engine.engine_core_pid if engine is not None else None

    def ready_engine(self) -> EngineHost:
        """The up and warm engine, for a task about to generate: starts it if nobody has,
        waits while it (re)starts; EngineDeadError once the worker has given up on it."""
        return self.keeper.get()

    def advertise(self) -> None:
        """Tell /healthz this worker serves its lanes (refreshed every heartbeat)."""
        with self._advert_lock:
            if self.serving:
                self.liveness.heartbeat(self.lane_names, self.hostname, ttl_s=_lapse_s())

    def withdraw(self) -> None:
        """The engine is down: /healthz must not count this worker for its lanes, now."""
        with self._advert_lock:
            try:
                self.liveness.forget(self.lane_names, self.hostname)
            except redis.RedisError as exc:  # the heartbeat lapses on its own
                log.warning("could not withdraw the lanes' heartbeat: %s", exc)

    def _warm_up(self, engine: EngineHost) -> None:
        from tailguard.tokens import PromptCounter
        from tailguard.warmup import exact_length_prompts, warm_up

        log.info("%s", warm_up(engine, exact_length_prompts(PromptCounter(engine.config.model)))
                 .describe())

    def _give_up(self, exc: BaseException) -> None:
        """The engine cannot serve (its first start failed, or it never came back after a
        death): stop this worker non-zero, so its supervisor can restart it."""
        from tailguard.warmup import failure_message

        self.stopping.set()
        self.withdraw()
        engine = self.engine
        config = engine.config if engine is not None else None
        log.critical("%s", failure_message(config.model, config.dtype, exc) if config
                     else f"the engine cannot serve, so this worker exits: {exc}")
        _exit_worker()

    def _publish(self, lane_name: str, job: GenerationJob) -> None:
        """Queue a reclaimed job on its lane again: a fresh message, with a fresh `expires`."""
        lane = next(l for l in self.borrowed_lanes if l.name == lane_name)
        self.app.send_task(lane.task_name, task_id=job.job_id, queue=lane.queue,
                           expires=lane.queue_ttl_s, kwargs=dataclasses.asdict(job),
                           ignore_result=True)  # as the API publishes it: the job record is the result

    def running_jobs(self) -> int:
        """The jobs running in this process now: its own engine's, borrowed ones included
        wherever they run (the idle engine's too)."""
        idle = self.idle_keeper
        return _engine_stats(self).in_flight + (
            idle.host.stats().in_flight if idle is not None and idle.host else 0)

    def _writer_for(self, job_id: str) -> DeltaWriter:
        # The write budget is the process's: every job running here counts, the one about
        # to start included. Counting only the own engine's let borrowed jobs on the idle
        # engine write every 50 ms beside a quiet own lane.
        flush_s = flush_interval(self.running_jobs() + 1, settings.STREAM_FLUSH_S.get(),
                                 settings.STREAM_WRITES_PER_S.get())
        return DeltaWriter(self.store.redis, job_id, flush_s=flush_s,
                           maxlen=self.store.stream_maxlen, ttl_s=self.store.ttl_s)


_attach_lock = threading.Lock()


def attached(app: Celery) -> WorkerRuntime | None:
    """The runtime attached to `app`, if this process is a set-up tailguard worker."""
    return getattr(app, _APP_ATTR, None)


def setup(app: Celery, hostname: str, queue_names: list[str], *,
          eager_engine: bool = True) -> WorkerRuntime:
    """Build this process's runtime for the lanes behind `queue_names` and attach it to `app`.

    With eager_engine the engine starts and warms up now, in the background, and the
    lanes are advertised to /healthz once it has; otherwise it starts with the first
    task that needs it (the integration tests use this to run a real worker with no
    engine). Either way an engine that cannot serve makes the worker exit non-zero.
    The worker's own heartbeat (and its reaping of dead peers) starts at once.
    """
    table = load_lanes()
    lanes = _lanes_for_queue_names(table, queue_names)
    spec = table.worker_for_queues(queue_names)
    borrow = spec.borrow if spec is not None else BorrowPolicy(lanes=())
    with _attach_lock:
        runtime = attached(app)
        if runtime is not None:
            return runtime
        client = redis_client.connect(settings.redis_url(), socket_connect_timeout=5,
                                      health_check_interval=30)
        store = JobStore.from_settings(client)
        from tailguard.engine import EngineHost

        borrowed = [table[name] for name in borrow.lanes]
        idle = engine_for(borrow, device_kind()) == "idle" and bool(borrowed)
        config = engine_config(lanes, [] if idle else borrowed)
        runtime = WorkerRuntime(app=app, hostname=hostname, lanes=lanes, store=store,
                                liveness=Liveness(client), borrow=borrow, borrowed_lanes=borrowed,
                                build_idle_engine=functools.partial(
                                    EngineHost, idle_engine_config(borrowed, borrow.max_borrowed))
                                if idle else None,
                                build_engine=functools.partial(EngineHost, config))
        setattr(app, _APP_ATTR, runtime)
    _serve_metrics(runtime)
    if eager_engine:
        runtime.keeper.start()
        if runtime.idle_keeper is not None:
            runtime.idle_keeper.start()
    threading.Thread(target=_heartbeat_loop, args=(runtime,), name="tailguard-heartbeat",
                     daemon=True).start()
    runtime.roamer = roamer_for(Pinning.from_env(), runtime.engine_core_pid)
    if runtime.roamer is not None:
        log.info("the engine core moves to cores %s while they are idle",
                 ",".join(map(str, runtime.roamer.frontend)))
        threading.Thread(target=runtime.roamer.run, args=(runtime.stopping,),
                         name="tailguard-roaming", daemon=True).start()
    if runtime.borrower is not None:
        log.info("borrowing from %s while %s is idle (%s)", ", ".join(borrow.lanes),
                 ", ".join(runtime.lane_names), borrow)
        threading.Thread(target=runtime.borrower.run, args=(runtime.stopping,),
                         name="tailguard-borrower", daemon=True).start()
    return runtime


def engine_config(lanes: list[Lane], borrowed: list[Lane] | None = None) -> EngineConfig:
    """The engine of a worker serving `lanes` (largest batch and context among them) and
    borrowing from `borrowed`: then its context fits their requests too, and it schedules
    by vLLM priority, so its own requests go before borrowed ones."""
    from tailguard.engine import EngineConfig

    model = settings.MODEL.get()
    if not model:
        raise RuntimeError("TAILGUARD_MODEL is not set: point it at a model directory or a "
                           "Hugging Face id (`tailguard make-demo-model DIR` builds a demo one)")
    max_num_seqs, max_len = engine_settings_for(lanes, borrowed or ())
    limit = model_max_len(model)
    if limit is not None:
        max_len = min(max_len, limit)
    return EngineConfig(model=model, max_num_seqs=max_num_seqs, max_model_len=max_len,
                        dtype=serving_dtype(model, settings.DTYPE.get()),
                        log_stats=settings.VLLM_METRICS.get(),
                        extra={"scheduling_policy": "priority"} if borrowed else {})


def idle_engine_config(borrowed: list[Lane], slots: int) -> EngineConfig:
    """The idle-priority engine of a worker borrowing from `borrowed`: `slots` (B) requests,
    the context of their largest lane."""
    config = engine_config(borrowed)
    return dataclasses.replace(config, max_num_seqs=slots)


def teardown(app: Celery) -> None:
    """Withdraw the heartbeat, shut the engine down and detach the runtime (idempotent)."""
    with _attach_lock:
        runtime = attached(app)
        if runtime is None:
            return
        setattr(app, _APP_ATTR, None)
    runtime.stopping.set()
    runtime.withdraw()
    if runtime.borrower is not None and not runtime.borrower.give_back(timeout_s=10):
        log.warning("borrowed jobs still running at shutdown: they end with the engine")
    try:
        runtime.liveness.forget_worker(runtime.hostname)
    except redis.RedisError:
        pass
    runtime.keeper.stop()
    if runtime.idle_keeper is not None:
        runtime.idle_keeper.stop()


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

    from tailguard.metrics import BorrowCollector, WorkerCollector

    REGISTRY.register(WorkerCollector(runtime.hostname, lambda: _engine_stats(runtime)))
    if runtime.borrower is not None:
        REGISTRY.register(BorrowCollector(runtime.hostname, runtime.borrower.stats))
    addr = settings.WORKER_METRICS_ADDR.get()
    start_http_server(port, addr=addr)
    log.info("metrics on http://%s:%d/metrics", addr, port)


def _lanes_for_queue_names(table: LaneTable, names: list[str]) -> list[Lane]:
    lanes = table.lanes_for_queues(names)
    check_worker_lanes(lanes)
    return lanes


def _lapse_s() -> float:
    return settings.WORKER_HEARTBEAT_S.get() * LAPSE_PERIODS


def _engine_stats(runtime: WorkerRuntime) -> HostStats:
    """The current engine host's counters (a restarted engine starts from zero)."""
    from tailguard.engine_stats import HostStats

    engine = runtime.engine
    return engine.stats() if engine is not None else HostStats()


def _heartbeat_loop(runtime: WorkerRuntime) -> None:
    """Every period: this process is alive (read by reapers), its lanes are served while
    its engine is (read by GET /healthz), its engine is checked for a death nobody saw,
    and the running jobs of dead peers are reaped."""
    period = settings.WORKER_HEARTBEAT_S.get()
    reaper = Reaper(runtime.store, runtime.liveness, period,
                    Redeliverer(runtime.store, runtime.app.connection_for_write,
                                settings.REDELIVER_AFTER_S.get(), runtime.lanes, confirm_s=period))
    while not runtime.stopping.is_set():
        try:
            runtime.liveness.worker_alive(runtime.hostname, ttl_s=_lapse_s())
            runtime.keeper.check()
            if runtime.idle_keeper is not None:
                runtime.idle_keeper.check()
            runtime.advertise()
            reaper.run_once()
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
    return {"ready": runtime.serving, "engine": runtime.keeper.state,
            "restarts": runtime.keeper.restarts, "lanes": runtime.lane_names, "pid": os.getpid(),
            **_engine_stats(runtime).to_dict(),
            **({"engine_core_away": runtime.roamer.away,
                "engine_core_moves_away": runtime.roamer.moves_away}
               if runtime.roamer is not None else {}),
            **(runtime.borrower.stats().to_dict() if runtime.borrower is not None else {})}
