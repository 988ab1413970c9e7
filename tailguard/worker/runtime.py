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
worker exit non-zero instead of serving. A worker serving several lanes takes them in
their order with a limit per lane on its engine (tailguard/worker/lane_gate.py), and its
engine schedules their requests by vLLM priority in the same order.

Each of those is a part (`Part`: `start()`, `stop()`, its own thread), built with only
what it uses and listed in `_parts` in the order they start; `teardown` withdraws the
lanes, then stops the parts in reverse (the engines among them: without that a warm
shutdown hangs on vLLM's engine-core process). Nothing in the parts imports this module.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import redis
from celery import Celery
from celery.platforms import EX_FAILURE
from celery.worker import state as worker_state

from tailguard import settings
from tailguard.engine.keeper import IDLE, SERVING, EngineKeeper
from tailguard.host.cores import Pinning, shares_frontend
from tailguard.host.devices import device_kind
from tailguard.host.roaming import EngineCoreRoamer, roamer_for
from tailguard.jobs.liveness import Liveness
from tailguard.jobs.prefix_index import PrefixIndex
from tailguard.jobs.reaper import Reaper
from tailguard.jobs.redeliver import Redeliverer
from tailguard.jobs.store import JobStore
from tailguard.jobs.stream import DeltaWriter, flush_interval, writes_per_s_for
from tailguard.lanes.dispatch import capped
from tailguard.lanes.table import Lane, LaneTable, check_worker_lanes, load_lanes
from tailguard.redis import client as redis_client
from tailguard.redis import keys
from tailguard.worker import probe
from tailguard.worker.engine_config import check_engine_options, engine_config
from tailguard.worker.heartbeat import Heartbeat, lapse_s
from tailguard.worker.lane_gate import LaneGate
from tailguard.worker.runner import JobRunner, Prioritized

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
    #: stream entries per second its running jobs write together (`flush_interval`)
    stream_writes_per_s: float = writes_per_s_for("cpu", None)
    #: every lane of the deployment, by name
    all_lanes: dict[str, Lane] = field(default_factory=dict)
    #: the queues it consumes now, within each lane's per-engine limit (None: a worker built
    #: without its Celery consumer, as some tests build one)
    gate: LaneGate | None = None
    #: prefix affinity's index and offers (None: off)
    offers: PrefixIndex | None = None
    #: its per-engine limit for each lane, advertised with its heartbeat (admission counts the
    #: lane's slots with it; prefix affinity offers a job only to a worker under it)
    lane_slots: dict[str, int] = field(default_factory=dict)
    stopping: threading.Event = field(default_factory=threading.Event)
    keeper: EngineKeeper[EngineHost] = field(init=False)
    #: one runner per lane: each runs its lane's jobs at the lane's vLLM priority
    runners: dict[str, JobRunner] = field(init=False)
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
        self.runners = {lane.name: self._runner_at(priority)
                        for priority, lane in enumerate(self.lanes)}

    def _runner_at(self, priority: int) -> JobRunner:
        """A runner whose requests the engine schedules at vLLM `priority` (lower first)."""
        if priority == 0:
            return JobRunner(self.ready_engine, self.store, self._writer_for, self.hostname,
                             engine_died=self.keeper.died, offers=self.offers,
                             prefilled=self._prefilled)
        return JobRunner(lambda: Prioritized(self.ready_engine(), priority), self.store,
                         self._writer_for, self.hostname,
                         engine_died=lambda engine: self.keeper.died(engine.host),
                         offers=self.offers, prefilled=self._prefilled)

    def _prefilled(self, job_id: str) -> None:
        if self.gate is not None:
            self.gate.prefilled(job_id)

    @property
    def runner(self) -> JobRunner:
        """The first lane's runner (what expires a job it never ran: any runner can)."""
        return next(iter(self.runners.values()))

    def runner_for(self, lane: str) -> JobRunner:
        return self.runners.get(lane) or self.runner

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
                self.liveness.heartbeat(self.lane_names, self.hostname, ttl_s=lapse_s(),
                                        slots=self.lane_slots or None)

    def withdraw(self) -> None:
        """The engine is down: /healthz must not count this worker for its lanes, now."""
        with self._advert_lock:
            try:
                self.liveness.forget(self.lane_names, self.hostname)
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

    def _writer_for(self, job_id: str) -> DeltaWriter:
        # The write budget is the process's: every job running here counts, the one about
        # to start included.
        flush_s = flush_interval(engine_stats_of(self).in_flight + 1, settings.STREAM_FLUSH_S.get(),
                                 self.stream_writes_per_s)
        return DeltaWriter(self.store.redis, job_id, flush_s=flush_s,
                           maxlen=self.store.stream_maxlen, ttl_s=self.store.ttl_s)


_attach_lock = threading.Lock()


def attached(app: Celery) -> WorkerRuntime | None:
    """The runtime attached to `app`, if this process is a set-up tailguard worker."""
    return getattr(app, _APP_ATTR, None)


def setup(app: Celery, hostname: str, queue_names: list[str], *,
          eager_engine: bool = True, consumer: Any = None) -> WorkerRuntime:
    """Build this process's runtime for the lanes behind `queue_names` and attach it to `app`.

    With eager_engine the engine starts and warms up now, in the background, and the
    lanes are advertised to /healthz once it has; otherwise it starts with the first
    task that needs it (the integration tests use this to run a real worker with no
    engine). Either way an engine that cannot serve makes the worker exit non-zero.
    The worker's own heartbeat (and its reaping of dead peers) starts at once. `consumer`
    (Celery's) is what the lane gate changes the consumed queues of.
    """
    table = load_lanes()
    lanes = lanes_for_queue_names(table, queue_names)
    entry = settings.WORKER.get()  # `tailguard worker` names its entry; by hand, the queues do
    spec = table.worker(entry) if entry else table.worker_for_queues(queue_names)
    check_engine_options(table)
    options = spec.engine if spec is not None else table.engine
    device = device_kind()
    with _attach_lock:
        runtime = attached(app)
        if runtime is not None:
            return runtime
        client = redis_client.connect(settings.redis_url(), socket_connect_timeout=5,
                                      health_check_interval=30)
        store = JobStore.from_settings(client)
        offers = PrefixIndex.from_settings(client)  # None: prefix affinity is off
        own = {l.name: keys.worker_queue(l.queue, hostname) for l in lanes} if offers else {}
        limits = capped(lanes, _engine_cap())
        from tailguard.engine.host import EngineHost

        runtime = WorkerRuntime(app=app, hostname=hostname, lanes=lanes, store=store,
                                all_lanes={l.name: l for l in table},
                                liveness=Liveness(client),
                                gate=LaneGate(limits, consumer, own,
                                              spec.max_prefill_tokens if spec else 0)
                                if consumer is not None
                                else None, offers=offers,
                                lane_slots={l.name: l.engine_slots for l in limits},
                                build_engine=functools.partial(
                                    EngineHost, engine_config(lanes, options)),
                                stream_writes_per_s=writes_per_s_for(
                                    device, settings.STREAM_WRITES_PER_S.get()))
        setattr(app, _APP_ATTR, runtime)
    if own and runtime.gate is not None:
        runtime.gate.apply()  # this worker's own queues too, from now (the consumer's thread)
    runtime.roamer = roamer_for(Pinning.from_env(), runtime.engine_core_pid)
    runtime.start(_parts(runtime, eager_engine))
    return runtime


def _parts(runtime: WorkerRuntime, eager_engine: bool) -> list[Part]:
    """The worker's parts, in the order they start (they stop in reverse): its metrics
    first and last, so they see every other part; the engine before the heartbeat that
    checks it and advertises its lanes. A new part is one line here, where it can read what
    it needs from the runtime."""
    period = settings.WORKER_HEARTBEAT_S.get()
    heartbeat = Heartbeat(runtime.liveness, runtime.hostname, period,
                          checks=[runtime.keeper.check], advertise=runtime.advertise,
                          reaper=Reaper(runtime.store, runtime.liveness, period, Redeliverer(
                              runtime.store, runtime.app.connection_for_write,
                              settings.REDELIVER_AFTER_S.get(),
                              list(runtime.all_lanes.values()), confirm_s=period,
                              offers=runtime.offers)))
    parts: list[Part | None] = [
        _metrics_server(runtime, heartbeat),
        _Engines([runtime.keeper], eager=eager_engine),
        heartbeat,
        runtime.roamer,
    ]
    return [p for p in parts if p is not None]


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


def _metrics_server(runtime: WorkerRuntime, heartbeat: Heartbeat) -> MetricsServer | None:
    """This worker's Prometheus endpoint (None when its port is 0: off): its engine host's
    view and vLLM's own series labelled with its lanes; and GET /livez, its engine and
    heartbeat (tailguard/worker/probe.py)."""
    port = settings.WORKER_METRICS_PORT.get()
    if not port:
        return None
    from tailguard.observe.metrics import MetricsServer, WorkerCollector
    from tailguard.observe.vllm_series import VllmSeriesCollector

    collectors: list[Collector] = [
        WorkerCollector(runtime.hostname, lambda: engine_stats_of(runtime)),
        VllmSeriesCollector(runtime.hostname, lambda: runtime.lane_names)]

    def livez() -> tuple[bool, dict[str, object]]:
        verdict = probe.liveness(runtime.keeper.state, heartbeat.age_s(), lapse_s(),
                                 stopping=runtime.stopping.is_set())
        return verdict.alive, verdict.to_dict()

    return MetricsServer(port, settings.WORKER_METRICS_ADDR.get(), collectors, livez=livez)


def lanes_for_queue_names(table: LaneTable, names: list[str]) -> list[Lane]:
    lanes = table.lanes_for_queues(names)
    check_worker_lanes(lanes)
    return lanes


def engine_stats_of(runtime: WorkerRuntime) -> HostStats:
    """The current engine host's counters (a restarted engine starts from zero)."""
    from tailguard.engine.stats import HostStats

    engine = runtime.engine
    return engine.stats() if engine is not None else HostStats()


def _engine_cap() -> int:
    """What this worker's engine's per-engine lane limits are cut to:
    TAILGUARD_FRONTEND_ENGINE_MAX_RUNNING where the front end shares its cores (it steps
    slower); 0, its lanes' limits alone, elsewhere."""
    cap = settings.FRONTEND_ENGINE_MAX_RUNNING.get() if shares_frontend(Pinning.from_env()) else 0
    if cap > 0:
        log.info("this engine shares the front end's cores: its lanes' limits cut to %d", cap)
    return cap
