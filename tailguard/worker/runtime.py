"""Lifecycle of one tailguard worker process: its lanes, its engine, its heartbeat.

A worker serves the lanes it consumes (`-Q short` or `-Q long,batch`). Once its
consumer is ready, ``tasks/worker.py`` calls `setup`, which builds a WorkerRuntime and
attaches it to the Celery app, where the tasks reach it (`WorkerRuntime.of(task.app)`).
The runtime hosts one EngineHost built from those lanes' engine settings
(``engine_config``): it starts the engine, runs a warm-up on it
(tailguard/engine/warmup.py), and only then advertises the lanes in Redis with a
heartbeat (``heartbeat``), which is what GET /healthz reads. An engine that dies is
restarted in-process (tailguard/engine/keeper.py): the lanes are withdrawn from
/healthz at once and advertised again once the new engine has warmed up. An engine
that fails its first start or warm-up, or does not come back after a death, makes the
worker exit non-zero instead of serving. A worker whose [[workers]] entry borrows
from other lanes also runs a borrower thread (tailguard/worker/borrower.py) that
takes their jobs while its own lanes are idle.

Each of those is a part (`Part`: `start()`, `stop()`, its own thread), built with only
what it uses and listed in `_parts` in the order they start; `teardown` withdraws the
lanes, then stops the parts in reverse (the engines among them: without that a warm
shutdown hangs on vLLM's engine-core process). Nothing in the parts imports this module.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import redis
from celery import Celery
from celery.platforms import EX_FAILURE
from celery.worker import state as worker_state

from tailguard import settings
from tailguard.engine.keeper import IDLE, SERVING, EngineKeeper
from tailguard.host.cores import Pinning
from tailguard.host.devices import device_kind
from tailguard.host.procfs import idle_priority, normal_priority_threads
from tailguard.host.roaming import EngineCoreRoamer, roamer_for
from tailguard.jobs.lane_orders import LaneOrders
from tailguard.jobs.liveness import Liveness
from tailguard.jobs.reaper import Reaper
from tailguard.jobs.redeliver import Redeliverer
from tailguard.jobs.store import JobStore
from tailguard.jobs.stream import DeltaWriter, flush_interval, writes_per_s_for
from tailguard.jobs.task_message import kwargs_repr
from tailguard.lanes.borrowing import BorrowPolicy, resolve
from tailguard.lanes.table import Lane, LaneTable, check_worker_lanes, load_lanes, slots_for
from tailguard.redis import client as redis_client
from tailguard.worker.borrower import BORROWED_PRIORITY, Borrower, Prioritized
from tailguard.worker.engine_config import (
    check_engine_options,
    engine_config,
    idle_engine_config,
)
from tailguard.worker.heartbeat import Heartbeat, lapse_s
from tailguard.worker.lane_follower import LaneFollower, RunningJobs
from tailguard.worker.runner import GenerationJob, JobRunner

if TYPE_CHECKING:  # tailguard.engine's users import vLLM only when an engine starts
    from prometheus_client.registry import Collector

    from tailguard.engine.host import EngineHost
    from tailguard.engine.stats import HostStats
    from tailguard.observe.metrics import MetricsServer

log = logging.getLogger("tailguard.worker")


class Part(Protocol):
    """A part of the worker that owns its thread(s): started once set up, stopped at
    shutdown (Celery's bootsteps, in small)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


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
    #: stream entries per second its running jobs write together (`flush_interval`)
    stream_writes_per_s: float = writes_per_s_for("cpu", None)
    #: every lane of the deployment, by name: what a handed-back job is queued on again
    all_lanes: dict[str, Lane] = field(default_factory=dict)
    #: every lane the lane controller may have it serve (its own and its entry's moves_to;
    #: none for a worker it never moves)
    may_serve: list[str] = field(default_factory=list)
    #: its own jobs in flight, by lane: what a lane move drains or hands back
    own_jobs: RunningJobs = field(default_factory=RunningJobs)
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
    #: the parts started so far, in their order (`start`)
    _started: list[Part] = field(default_factory=list, repr=False)

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
            borrowed_runner, connect=self.app.connection_for_read, publish=self.publish,
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

    @property
    def standby_lanes(self) -> list[str]:
        """Lanes it may be moved to but does not serve now (admission queues for them)."""
        return [l for l in self.may_serve if l not in self.lane_names]

    def advertise(self) -> None:
        """Tell /healthz this worker serves its lanes (refreshed every heartbeat), and the
        lanes it may be moved to that it stands by for them."""
        with self._advert_lock:
            if self.serving:
                self.liveness.heartbeat(self.lane_names, self.hostname, ttl_s=lapse_s())
                if self.standby_lanes:
                    self.liveness.standby(self.standby_lanes, self.hostname, ttl_s=lapse_s())

    def withdraw(self) -> None:
        """The engine is down: /healthz must not count this worker for its lanes, now."""
        with self._advert_lock:
            self._forget(self.lane_names)
            self._forget(self.may_serve, standby=True)

    def replace_lanes(self, lanes: list[Lane]) -> None:
        """Serve `lanes` from now on: /healthz stops counting this worker for the old ones at
        once, and counts it for the new ones while its engine serves (every advertisement,
        the heartbeat's included, reads `lane_names` when it is written)."""
        check_worker_lanes(lanes)
        with self._advert_lock:
            old, self.lanes = self.lane_names, list(lanes)
            self._forget(old)
            self._forget(self.lane_names, standby=True)
        self.advertise()

    def _forget(self, lane_names: list[str], standby: bool = False) -> None:
        if standby and not self.may_serve:  # a worker never moved stands by for nothing
            return
        try:
            if standby:
                self.liveness.forget_standby(lane_names, self.hostname)
            else:
                self.liveness.forget(lane_names, self.hostname)
        except redis.RedisError as exc:  # the heartbeat lapses on its own
            log.warning("could not withdraw the lanes' heartbeat: %s", exc)

    def start(self, parts: list[Part]) -> None:
        """Start `parts` in their order; `stop` stops the started ones in reverse."""
        for part in parts:
            part.start()
            self._started.append(part)

    def stop(self) -> None:
        """The worker is stopping: its lanes are withdrawn at once, then its parts stop."""
        self.stopping.set()
        self.withdraw()
        while self._started:
            self._started.pop().stop()

    def _warm_up(self, engine: EngineHost) -> None:
        from tailguard.engine.warmup import exact_length_prompts, warm_up
        from tailguard.model.tokens import PromptCounter

        log.info("%s", warm_up(engine, exact_length_prompts(PromptCounter(engine.config.model)))
                 .describe())

    def _give_up(self, exc: BaseException) -> None:
        """The engine cannot serve (its first start failed, or it never came back after a
        death): stop this worker non-zero, so its supervisor can restart it."""
        from tailguard.engine.warmup import failure_message

        self.stopping.set()
        self.withdraw()
        engine = self.engine
        config = engine.config if engine is not None else None
        log.critical("%s", failure_message(config.model, config.dtype, exc) if config
                     else f"the engine cannot serve, so this worker exits: {exc}")
        exit_worker()

    def consume(self, *, add: tuple[str, ...] = (), cancel: tuple[str, ...] = ()) -> None:
        """Change the queues the Celery consumer takes from, in its own thread (the
        ``tailguard_consume`` control command, tasks/worker.py); raises if it did not answer."""
        slots = slots_for([self.all_lanes[q] for q in add]) if add else 0
        replies = self.app.control.broadcast(
            "tailguard_consume", arguments={"add": list(add), "cancel": list(cancel),
                                            "prefetch": slots},
            destination=[self.hostname], reply=True, timeout=10)
        if not replies:
            raise RuntimeError(f"the consumer did not confirm: add {add}, cancel {cancel}")

    def publish(self, lane_name: str, job: GenerationJob) -> None:
        """Queue a reclaimed job on its lane again: a fresh message, with a fresh `expires`."""
        lane = self.all_lanes.get(lane_name) or next(
            l for l in self.borrowed_lanes if l.name == lane_name)
        kwargs = dataclasses.asdict(job)
        # as the API publishes it: the job record is the result, and Flower sees no prompt text
        self.app.send_task(lane.task_name, task_id=job.job_id, queue=lane.queue,
                           expires=lane.queue_ttl_s, kwargs=kwargs, ignore_result=True,
                           kwargsrepr=kwargs_repr(kwargs))

    def running_jobs(self) -> int:
        """The jobs running in this process now: its own engine's, borrowed ones included
        wherever they run (the idle engine's too)."""
        idle = self.idle_keeper
        return engine_stats_of(self).in_flight + (
            idle.host.stats().in_flight if idle is not None and idle.host else 0)

    def _writer_for(self, job_id: str) -> DeltaWriter:
        # The write budget is the process's: every job running here counts, the one about
        # to start included. Counting only the own engine's let borrowed jobs on the idle
        # engine write every 50 ms beside a quiet own lane.
        flush_s = flush_interval(self.running_jobs() + 1, settings.STREAM_FLUSH_S.get(),
                                 self.stream_writes_per_s)
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
    lanes = lanes_for_queue_names(table, queue_names)
    entry = settings.WORKER.get()  # `tailguard worker` names its entry; by hand, the queues do
    spec = table.worker(entry) if entry else table.worker_for_queues(queue_names)
    check_engine_options(table)
    options = spec.engine if spec is not None else table.engine
    device = device_kind()
    borrow = resolve(spec.borrow, device, spec.name) if spec is not None else BorrowPolicy(lanes=())
    if spec is not None and spec.borrow.lanes and not borrow.lanes:
        log.info('not borrowing from %s: borrow_engine "auto" keeps a GPU\'s engine to its own '
                 'lanes ("own" would run borrowed jobs in it)', ", ".join(spec.borrow.lanes))
    with _attach_lock:
        runtime = attached(app)
        if runtime is not None:
            return runtime
        client = redis_client.connect(settings.redis_url(), socket_connect_timeout=5,
                                      health_check_interval=30)
        store = JobStore.from_settings(client)
        from tailguard.engine.host import EngineHost

        borrowed = [table[name] for name in borrow.lanes]
        idle = borrow.engine == "idle" and bool(borrowed)
        moves_to = [table[name] for name in spec.moves_to] if spec is not None else []
        config = engine_config(lanes, [] if idle else borrowed, options, moves_to=moves_to)
        runtime = WorkerRuntime(app=app, hostname=hostname, lanes=lanes, store=store,
                                all_lanes={l.name: l for l in table},
                                may_serve=[l for a in spec.assignments for l in a]
                                if moves_to else [],
                                liveness=Liveness(client), borrow=borrow, borrowed_lanes=borrowed,
                                build_idle_engine=functools.partial(
                                    EngineHost, idle_engine_config(borrowed, borrow.max_borrowed,
                                                                   options))
                                if idle else None,
                                build_engine=functools.partial(EngineHost, config),
                                stream_writes_per_s=writes_per_s_for(
                                    device, settings.STREAM_WRITES_PER_S.get()))
        setattr(app, _APP_ATTR, runtime)
    runtime.roamer = roamer_for(Pinning.from_env(), runtime.engine_core_pid)
    runtime.start(_parts(runtime, eager_engine, spec.assignments if spec is not None
                         and tuple(queue_names) == spec.lanes else [tuple(queue_names)]))
    return runtime


def _parts(runtime: WorkerRuntime, eager_engine: bool,
           assignments: list[tuple[str, ...]]) -> list[Part]:
    """The worker's parts, in the order they start (they stop in reverse): its metrics
    first and last, so they see every other part; the engines before the heartbeat that
    checks them and advertises their lanes; the heartbeat before the borrower, so this
    process stays alive for the reapers while the borrower gives its jobs back; the lane
    follower last (a worker its entry lets the controller move), so it stops first and no
    move starts while the rest stops. A new part is one line here, where it can read what
    it needs from the runtime."""
    period = settings.WORKER_HEARTBEAT_S.get()
    keepers = [k for k in (runtime.keeper, runtime.idle_keeper) if k is not None]
    parts: list[Part | None] = [
        _metrics_server(runtime),
        _Engines(keepers, eager=eager_engine),
        Heartbeat(runtime.liveness, runtime.hostname, period,
                  checks=[k.check for k in keepers], advertise=runtime.advertise,
                  reaper=Reaper(runtime.store, runtime.liveness, period, Redeliverer(
                      runtime.store, runtime.app.connection_for_write,
                      settings.REDELIVER_AFTER_S.get(),
                      list(runtime.all_lanes.values()), confirm_s=period))),
        runtime.roamer,
        runtime.borrower,
        _lane_follower(runtime, assignments) if len(assignments) > 1 else None,
    ]
    return [p for p in parts if p is not None]


def _lane_follower(runtime: WorkerRuntime, assignments: list[tuple[str, ...]]) -> LaneFollower:
    """The part that carries out the lane controller's orders for this worker."""

    def stop(old: tuple[str, ...]) -> None:
        runtime.consume(cancel=old)
        runtime.replace_lanes([])  # withdrawn now: admission stops counting its slots there

    def start(new: tuple[str, ...]) -> None:
        runtime.consume(add=new)
        runtime.replace_lanes([runtime.all_lanes[l] for l in new])

    return LaneFollower(runtime.hostname, LaneOrders(runtime.store.redis), assignments,
                        serving=lambda: tuple(runtime.lane_names), stop=stop, start=start,
                        running=runtime.own_jobs, period_s=settings.LANE_FOLLOW_S.get(),
                        drain_s=settings.MOVE_DRAIN_S.get())


def teardown(app: Celery) -> None:
    """Withdraw the heartbeat, stop the worker's parts and detach the runtime (idempotent)."""
    with _attach_lock:
        runtime = attached(app)
        if runtime is None:
            return
        setattr(app, _APP_ATTR, None)
    runtime.stop()


def exit_worker() -> None:
    """A warm shutdown that ends the process with EX_FAILURE: the consumer loop polls this
    flag (Celery's own SIGTERM handler sets it the same way) and worker_shutdown follows."""
    worker_state.should_stop = EX_FAILURE


class _Engines:
    """The worker's engine keepers as one part: started now (eager), or by the first task
    that needs one; stopped either way (without that a warm shutdown hangs on vLLM's
    engine-core process)."""

    def __init__(self, keepers: list[EngineKeeper[EngineHost]], *, eager: bool) -> None:
        self.keepers, self.eager = keepers, eager

    def start(self) -> None:
        if self.eager:
            for keeper in self.keepers:
                keeper.start()

    def stop(self) -> None:
        for keeper in self.keepers:
            keeper.stop()


def _metrics_server(runtime: WorkerRuntime) -> MetricsServer | None:
    """This worker's Prometheus endpoint (None when its port is 0: off): its engine host's
    view, vLLM's own series labelled with its lanes as they are at each scrape (lane moves
    change them), and its borrowing."""
    port = settings.WORKER_METRICS_PORT.get()
    if not port:
        return None
    from tailguard.observe.metrics import BorrowCollector, MetricsServer, WorkerCollector
    from tailguard.observe.vllm_series import VllmSeriesCollector

    collectors: list[Collector] = [
        WorkerCollector(runtime.hostname, lambda: engine_stats_of(runtime)),
        VllmSeriesCollector(runtime.hostname, lambda: runtime.lane_names)]
    if runtime.borrower is not None:
        collectors.append(BorrowCollector(runtime.hostname, runtime.borrower.stats))
    return MetricsServer(port, settings.WORKER_METRICS_ADDR.get(), collectors)


def lanes_for_queue_names(table: LaneTable, names: list[str]) -> list[Lane]:
    lanes = table.lanes_for_queues(names)
    check_worker_lanes(lanes)
    return lanes


def engine_stats_of(runtime: WorkerRuntime) -> HostStats:
    """The current engine host's counters (a restarted engine starts from zero)."""
    from tailguard.engine.stats import HostStats

    engine = runtime.engine
    return engine.stats() if engine is not None else HostStats()
