"""Lanes: the queues requests are split into, and the policy of each.

The table comes from one TOML file (``tailguard/lanes/lanes.toml`` documents every
field). It is loaded and validated once at start; a bad file raises
``ConfigError`` naming the field, so a typo stops the process instead of
silently routing everything to one queue.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from tailguard import settings
from tailguard.errors import ConfigError
from tailguard.lanes.engine_options import devices_per_engine, parse_engine_table

PRIORITY_CLASSES = ("interactive", "batch")
#: `replicas = "fill"`: as many workers of the entry as the GPUs no other worker takes allow
FILL = "fill"
_NAME_RE = re.compile(r"^[a-z][a-z0-9_-]{0,39}$")
_RATE_RE = re.compile(r"^$|^\d+(\.\d+)?/[smh]$")


def validate_lane_name(name: str) -> str:
    """Lane names are queue names and Redis key parts: keep them boring."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ConfigError(
            f"lane name {name!r} must match {_NAME_RE.pattern} (it is also the queue name)",
            field="lanes")
    return name


@dataclass(frozen=True)
class Lane:
    name: str
    max_tokens: int
    priority: str = "interactive"
    max_cost: int | None = None
    default_max_tokens: int | None = None
    deadline_s: float = 60.0
    queue_ttl_s: float = 300.0
    rate_limit: str = ""
    max_num_seqs: int = 8
    #: the most requests of this lane and the lanes after it in a worker's order that one engine
    #: runs at once (None: max_num_seqs); what keeps room on every engine for the lanes ahead of
    #: it (tailguard/lanes/dispatch.py)
    max_running: int | None = None
    #: this lane's jobs start on an engine only while it runs fewer jobs of the lanes ahead of
    #: it in a worker's order (None: no bound): long prompts go to engines with few short jobs
    #: decoding (tailguard/lanes/dispatch.py)
    max_ahead: int | None = None
    max_model_len: int = 2048
    dedicated: bool = False
    max_backlog_tokens: int | None = None
    max_wait_s: float | None = None

    @property
    def queue(self) -> str:
        """Queue names are lane names, so `celery worker -Q short` serves the short lane."""
        return self.name

    @property
    def task_name(self) -> str:
        """One Celery task name per lane, so Celery's per-task rate_limit is a per-lane limit."""
        return f"tailguard.generate.{self.name}"

    @property
    def promised_wait_s(self) -> float:
        """The longest predicted wait a request is accepted with: max_wait_s, else queue_ttl_s."""
        return self.max_wait_s if self.max_wait_s is not None else self.queue_ttl_s

    @property
    def engine_slots(self) -> int:
        """How many requests of this lane (and of the lanes after it in a worker's order) one
        engine serving it runs at once."""
        return min(self.max_running, self.max_num_seqs) if self.max_running else self.max_num_seqs

    @property
    def effective_default_max_tokens(self) -> int:
        if self.default_max_tokens is not None:
            return self.default_max_tokens
        return min(256, self.max_tokens)

    def context_len(self, model_max_len: int | None) -> int:
        """The engine context of this lane: its max_model_len, never more than the model's."""
        if model_max_len is None:
            return self.max_model_len
        return min(self.max_model_len, model_max_len)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["default_max_tokens"] = self.effective_default_max_tokens
        d["queue"] = self.queue
        return d


@dataclass(frozen=True)
class WorkerSpec:
    """One [[workers]] entry: the worker process(es) `tailguard up` starts for it, each one
    engine serving `lanes` in their order, each lane within its per-engine limit
    (tailguard/lanes/dispatch.py)."""

    name: str
    lanes: tuple[str, ...]
    #: the GPUs of its engine, numbered as the process sees them (vLLM's numbering, within
    #: CUDA_VISIBLE_DEVICES); None: placed by tailguard/launch/worker_placement.py
    devices: tuple[int, ...] | None = None
    #: how many such workers: an integer, or FILL
    replicas: int | str = 1
    #: vLLM engine arguments, the file's [engine] defaults merged with the entry's own
    engine: dict[str, Any] = field(default_factory=dict, hash=False)
    #: its engine starts no job while those not yet at their first token have this many
    #: prompt tokens to prefill (tailguard/lanes/dispatch.py); 0: no bound
    max_prefill_tokens: int = 0

    @property
    def devices_per_engine(self) -> int:
        """GPUs one of its engines takes: its parallel sizes multiplied (engine_options)."""
        return devices_per_engine(self.engine)

    def replica_name(self, k: int) -> str:
        """The name of its k-th worker (from 1): the entry's own, then ``long-2``, ``long-3``."""
        return self.name if k == 1 else f"{self.name}-{k}"


@dataclass(frozen=True)
class LaneTable:
    lanes: tuple[Lane, ...]
    workers: tuple[WorkerSpec, ...] = field(default=())
    #: the file's top-level [engine] table: every worker's engine defaults
    engine: dict[str, Any] = field(default_factory=dict, hash=False)
    #: each engine table as the file writes it, with its place (``engine``,
    #: ``workers[1].engine``): what engine_options.check_against reports on
    engine_tables: tuple[tuple[str, dict[str, Any]], ...] = field(default=(), hash=False)
    #: the file it was loaded from ("" when parsed from data)
    source: str = ""

    def __getitem__(self, name: str) -> Lane:
        for lane in self.lanes:
            if lane.name == name:
                return lane
        raise KeyError(name)

    def __iter__(self):
        return iter(self.lanes)

    def __len__(self) -> int:
        return len(self.lanes)

    @property
    def names(self) -> list[str]:
        return [lane.name for lane in self.lanes]

    @property
    def max_prefill_tokens(self) -> int:
        """The first worker entry's ``max_prefill_tokens``: the bound of a fleet whose every
        engine serves every lane, as the simulator's fleet setups model it."""
        return self.workers[0].max_prefill_tokens if self.workers else 0

    def worker(self, name: str) -> WorkerSpec:
        """The entry named `name`, or whose replica it names (``long-2`` of ``long``)."""
        for w in self.workers:
            if w.name == name:
                return w
        base, dash, k = name.rpartition("-")
        if dash and k.isdigit() and int(k) >= 2:
            for w in self.workers:
                if w.name == base and (w.replicas == FILL or int(k) <= int(w.replicas)):
                    return w
        raise ConfigError(f"no worker named {name!r} in the lanes file "
                          f"(known: {', '.join(w.name for w in self.workers)})", field="workers")

    def worker_for_lane(self, lane: str) -> WorkerSpec:
        """The configured worker whose first lane is `lane` (else any that serves it)."""
        self[lane]  # raises KeyError for an unknown lane
        for w in self.workers:
            if w.lanes[0] == lane:
                return w
        for w in self.workers:
            if lane in w.lanes:
                return w
        return WorkerSpec(name=lane, lanes=(lane,), engine=dict(self.engine))

    def worker_for_queues(self, queues: Iterable[str]) -> WorkerSpec | None:
        """The configured worker that serves exactly `queues` (in that order), if any: how a
        worker started with `-Q` finds its engine table."""
        wanted = tuple(queues)
        return next((w for w in self.workers if w.lanes == wanted), None)

    def sharing(self, lane: str) -> tuple[str, ...]:
        """The lanes whose running jobs take `lane`'s per-engine slots: those after it on a
        configured worker that serves it (a lane's limit counts its jobs and those of the lanes
        after it: tailguard/lanes/dispatch.py), in table order."""
        after = {l for w in self.workers if lane in w.lanes
                 for l in w.lanes[w.lanes.index(lane) + 1:]}
        return tuple(n for n in self.names if n in after)

    def lanes_for_queues(self, queues: Iterable[str]) -> list[Lane]:
        """The lanes a worker consuming `queues` serves, in the order given."""
        out = []
        for q in queues:
            try:
                out.append(self[q])
            except KeyError:
                raise ConfigError(f"queue {q!r} is not a lane (lanes: {', '.join(self.names)})",
                                  field="queues") from None
        return out

    @property
    def max_visibility_s(self) -> float:
        """Longest a late-acked message may legitimately stay unacked: queue wait + deadline."""
        return max(lane.queue_ttl_s + lane.deadline_s for lane in self.lanes)


def engine_settings_for(lanes: list[Lane]) -> tuple[int, int]:
    """(max_num_seqs, max_model_len) of an engine serving `lanes`: the largest of each (each
    lane's own jobs stay within its `engine_slots`: tailguard/lanes/dispatch.py)."""
    return (max(l.max_num_seqs for l in lanes), max(l.max_model_len for l in lanes))


def slots_for(lanes: list[Lane]) -> int:
    """The jobs a worker serving `lanes` runs at once: their largest batch."""
    return max(l.max_num_seqs for l in lanes)


def check_worker_lanes(lanes: list[Lane]) -> None:
    """A worker serving a dedicated lane (e.g. short) must serve nothing else."""
    if len(lanes) > 1:
        for lane in lanes:
            if lane.dedicated:
                raise ConfigError(
                    f"lane {lane.name!r} is dedicated: its worker cannot also serve "
                    f"{', '.join(l.name for l in lanes if l is not lane)}", field="workers")


# --- loading ---------------------------------------------------------------------------

@dataclass(frozen=True)
class FieldDoc:
    """One field of the lanes file: the types it takes, its default as people read it, what it
    means. The parser checks types against it and docs/configuration.md is generated from it."""

    types: tuple[type, ...]
    default: str
    doc: str


#: [lanes.<name>] fields, in the order the docs list them
LANE_FIELDS: dict[str, FieldDoc] = {
    "priority": FieldDoc((str,), '"interactive"',
                         '`"interactive"` or `"batch"`: a request\'s `priority` must match'),
    "max_cost": FieldDoc((int,), "none",
                         "upper bound of cost (prompt tokens + max_tokens); none: takes every "
                         "request of its class left by the lanes before it"),
    "max_tokens": FieldDoc((int,), "required", "cap on output tokens"),
    "default_max_tokens": FieldDoc((int,), "min(256, max_tokens)",
                                   "used when the request gives none"),
    "deadline_s": FieldDoc((int, float), "60",
                           "engine time once started; then the engine request is aborted (KV "
                           "cache freed) and the job ends with the partial text, finish_reason "
                           '`"deadline"`'),
    "queue_ttl_s": FieldDoc((int, float), "300",
                            "longest wait in the queue (Celery `expires`); then the job ends "
                            "`expired` without touching an engine"),
    "rate_limit": FieldDoc((str,), '""',
                           'Celery `rate_limit` of the lane\'s task, per worker (`"20/s"`); '
                           "spaces task starts, never rejects"),
    "max_num_seqs": FieldDoc((int,), "8", "engine batch size, and the worker's thread concurrency"),
    "max_running": FieldDoc((int,), "max_num_seqs",
                            "the most requests of this lane and the lanes after it (in a "
                            "worker's order) one engine runs at once: room kept on every engine "
                            "for the lanes ahead of it"),
    "max_ahead": FieldDoc((int,), "none",
                          "a request of this lane starts on an engine only while it runs fewer "
                          "requests of the lanes ahead of it (in a worker's order) than this: "
                          "long prompts' prefill kept off engines busy with short requests"),
    "max_model_len": FieldDoc((int,), "2048", "engine context (never more than the model's own)"),
    "dedicated": FieldDoc((bool,), "false", "a worker serving this lane serves nothing else"),
    "max_backlog_tokens": FieldDoc((int,), "none",
                                   "bound on the cost tokens queued on the lane (at least "
                                   "max_model_len); past it a request is refused, 429 `lane_full`"),
    "max_wait_s": FieldDoc((int, float), "queue_ttl_s",
                           "the longest predicted wait a request is accepted with (at most "
                           "queue_ttl_s); past it, 429 `wait_too_long`"),
}


def _lane_from(name: str, raw: Any) -> Lane:
    where = f"lanes.{name}"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a table", field=where)
    for key, value in raw.items():
        if key not in LANE_FIELDS:
            raise ConfigError(f"{where}.{key}: unknown field (known: {', '.join(LANE_FIELDS)})",
                              field=f"{where}.{key}")
        types = LANE_FIELDS[key].types
        # bool is an int in Python; a lane field is never meant to be both
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise ConfigError(f"{where}.{key}: expected {' or '.join(t.__name__ for t in types)}, "
                              f"got {value!r}", field=f"{where}.{key}")
    if "max_tokens" not in raw:
        raise ConfigError(f"{where}.max_tokens is required (the lane's output cap)",
                          field=f"{where}.max_tokens")
    lane = Lane(name=name, **raw)

    def positive(key: str, value: float | None) -> None:
        if value is not None and value <= 0:
            raise ConfigError(f"{where}.{key} must be > 0, got {value}", field=f"{where}.{key}")

    if lane.priority not in PRIORITY_CLASSES:
        raise ConfigError(f"{where}.priority must be one of {PRIORITY_CLASSES}, got {lane.priority!r}",
                          field=f"{where}.priority")
    for key in ("max_cost", "max_tokens", "default_max_tokens", "deadline_s", "queue_ttl_s",
                "max_num_seqs", "max_running", "max_ahead", "max_model_len", "max_backlog_tokens",
                "max_wait_s"):
        positive(key, getattr(lane, key))
    if lane.max_backlog_tokens is not None and lane.max_backlog_tokens < lane.max_model_len:
        # so the costliest request the lane can take always fits when its queue is empty
        raise ConfigError(f"{where}.max_backlog_tokens ({lane.max_backlog_tokens}) is below "
                          f"max_model_len ({lane.max_model_len}): one request could never fit",
                          field=f"{where}.max_backlog_tokens")
    if lane.max_wait_s is not None and lane.max_wait_s > lane.queue_ttl_s:
        raise ConfigError(f"{where}.max_wait_s ({lane.max_wait_s}) exceeds queue_ttl_s "
                          f"({lane.queue_ttl_s}): such a request would expire in the queue",
                          field=f"{where}.max_wait_s")
    if lane.default_max_tokens is not None and lane.default_max_tokens > lane.max_tokens:
        raise ConfigError(f"{where}.default_max_tokens ({lane.default_max_tokens}) exceeds "
                          f"max_tokens ({lane.max_tokens})", field=f"{where}.default_max_tokens")
    if not _RATE_RE.match(lane.rate_limit):
        raise ConfigError(f"{where}.rate_limit must look like Celery's '10/s', '100/m' or '', "
                          f"got {lane.rate_limit!r}", field=f"{where}.rate_limit")
    return lane


def _workers_from(raw: Any, lanes: tuple[Lane, ...], engine: dict[str, Any],
                  ) -> tuple[tuple[WorkerSpec, ...], list[tuple[str, dict[str, Any]]]]:
    """The [[workers]] entries, and each one's own engine table with its place."""
    if raw is None:
        return tuple(WorkerSpec(name=l.name, lanes=(l.name,), engine=dict(engine))
                     for l in lanes), []
    if not isinstance(raw, list) or not raw:
        raise ConfigError("workers must be a non-empty array of tables ([[workers]])", field="workers")
    names = {l.name: l for l in lanes}
    specs: list[WorkerSpec] = []
    tables: list[tuple[str, dict[str, Any]]] = []
    for i, w in enumerate(raw):
        where = f"workers[{i}]"
        if not isinstance(w, dict):
            raise ConfigError(f"{where} must be a table", field=where)
        unknown = set(w) - set(WORKER_FIELDS)
        if unknown:
            raise ConfigError(f"{where}: unknown field(s) {sorted(unknown)}", field=where)
        wl = w.get("lanes")
        if not isinstance(wl, list) or not wl or not all(isinstance(x, str) for x in wl):
            raise ConfigError(f"{where}.lanes must be a non-empty list of lane names",
                              field=f"{where}.lanes")
        for ln in wl:
            if ln not in names:
                raise ConfigError(f"{where}.lanes: unknown lane {ln!r} (lanes: {', '.join(names)})",
                                  field=f"{where}.lanes")
        name = w.get("name", wl[0])
        validate_lane_name(name)
        own = parse_engine_table(w.get("engine", {}), f"{where}.engine")
        if own:
            tables.append((f"{where}.engine", own))
        spec = WorkerSpec(name=name, lanes=tuple(wl), engine={**engine, **own})
        spec = dataclasses.replace(spec, replicas=_replicas_from(w, where),
                                   devices=_devices_from(w, where, spec.devices_per_engine),
                                   max_prefill_tokens=_prefill_bound_from(w, where))
        if spec.devices is not None and spec.replicas != 1:
            raise ConfigError(f"{where}: `devices` names the GPUs of one worker, so replicas "
                              f"must be 1 (leave devices out to have them placed)",
                              field=f"{where}.replicas")
        check_worker_lanes([names[x] for x in wl])
        specs.append(spec)
    if len({s.name for s in specs}) != len(specs):
        raise ConfigError("worker names must be unique", field="workers")
    if sum(1 for s in specs if s.replicas == FILL) > 1:
        raise ConfigError(f'only one [[workers]] entry may have replicas = "{FILL}" (the GPUs '
                          "left would have no single owner)", field="workers")
    for s in specs:
        clash = [o.name for o in specs if s.replicas != 1 and o.name.startswith(f"{s.name}-")
                 and o.name[len(s.name) + 1:].isdigit()]
        if clash:
            raise ConfigError(f"worker {clash[0]!r} takes the name of a replica of {s.name!r} "
                              f"({s.name}-2, {s.name}-3, ...)", field="workers")
    served = {ln for s in specs for ln in s.lanes}
    missing = [l.name for l in lanes if l.name not in served]
    if missing:
        raise ConfigError(f"no worker serves lane(s) {missing}: requests there would wait forever",
                          field="workers")
    return tuple(specs), tables


def _replicas_from(w: dict[str, Any], where: str) -> int | str:
    replicas = w.get("replicas", 1)
    if replicas != FILL and (not isinstance(replicas, int) or isinstance(replicas, bool)
                             or replicas < 1):
        raise ConfigError(f'{where}.replicas must be an integer >= 1 or "{FILL}", got '
                          f"{replicas!r}", field=f"{where}.replicas")
    return replicas


def _prefill_bound_from(w: dict[str, Any], where: str) -> int:
    bound = w.get("max_prefill_tokens", 0)
    if not isinstance(bound, int) or isinstance(bound, bool) or bound < 0:
        raise ConfigError(f"{where}.max_prefill_tokens must be an integer >= 0 (0: no bound), "
                          f"got {bound!r}", field=f"{where}.max_prefill_tokens")
    return bound


def _devices_from(w: dict[str, Any], where: str, need: int) -> tuple[int, ...] | None:
    """`devices = [0, 1]`, or `gpu = N` as `devices = [N]`; None when neither is given."""
    if "gpu" in w and "devices" in w:
        raise ConfigError(f"{where}: give gpu or devices, not both (gpu = N is devices = [N])",
                          field=f"{where}.gpu")
    key = "gpu" if "gpu" in w else "devices"
    if key not in w:
        return None
    raw = [w[key]] if key == "gpu" else w[key]
    if (not isinstance(raw, list) or not raw
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in raw)):
        what = "a GPU number" if key == "gpu" else "a non-empty list of GPU numbers"
        raise ConfigError(f"{where}.{key} must be {what} >= 0 (as the process sees them: "
                          "within CUDA_VISIBLE_DEVICES)", field=f"{where}.{key}")
    if len(set(raw)) != len(raw):
        raise ConfigError(f"{where}.{key} names a GPU twice: {raw}", field=f"{where}.{key}")
    if len(raw) != need:
        raise ConfigError(f"{where}.{key} names {len(raw)} GPU(s), but its engine takes {need} "
                          f"(tensor x pipeline x prefill context x data parallel sizes)",
                          field=f"{where}.{key}")
    return tuple(raw)


#: [[workers]] fields, in the order the docs list them
WORKER_FIELDS: dict[str, FieldDoc] = {
    "name": FieldDoc((str,), "its first lane", "the worker's name (`tailguard worker --worker NAME`)"),
    "lanes": FieldDoc((list,), "required",
                      "the lanes it serves, in priority order: a free slot takes the first "
                      "lane with a job waiting that is below its `max_running` (and "
                      "`max_ahead`) on this engine; a batch lane only while no interactive "
                      "lane has one"),
    "devices": FieldDoc((list,), "placed",
                        "CUDA host: the GPUs of its engine, numbered as the process sees them "
                        "(within `CUDA_VISIBLE_DEVICES`), as many as its engine's parallel sizes "
                        "multiply to; left out, tailguard places it on free ones"),
    "gpu": FieldDoc((int,), "placed", "CUDA host: `gpu = N` is `devices = [N]`"),
    "replicas": FieldDoc((int, str), "1",
                         'how many workers of this entry (`long`, `long-2`, ...); `"fill"` (one '
                         "entry at most): as many as the GPUs the others leave allow, at least "
                         "one (one on a CPU host)"),
    "max_prefill_tokens": FieldDoc((int,), "0",
                                   "its engine starts no job of a lane while its jobs of that "
                                   "lane and those before it, not yet at their first token, have "
                                   "this many prompt tokens to prefill (those not in its prefix "
                                   "cache, as the API counted them): a burst of long prompts "
                                   "spreads over the engines instead of stacking on one; 0: no "
                                   "bound"),
    "engine": FieldDoc((dict,), "{}",
                       "vLLM engine arguments (`AsyncEngineArgs`), merged over the file's "
                       "top-level `[engine]` table, e.g. `{tensor_parallel_size = 2, "
                       "gpu_memory_utilization = 0.85}`; checked against vLLM's `EngineArgs` "
                       "at start; model, max_num_seqs, max_model_len, dtype and the like come "
                       "from the lanes and settings and are refused here"),
}


def parse_lanes(data: dict[str, Any]) -> LaneTable:
    """Build a LaneTable from parsed TOML, raising ConfigError naming the bad field."""
    unknown = set(data) - {"lanes", "workers", "engine"}
    if unknown:
        raise ConfigError(f"unknown top-level key(s) {sorted(unknown)} (expected lanes, workers, "
                          "engine)", field=sorted(unknown)[0])
    raw_lanes = data.get("lanes")
    if not isinstance(raw_lanes, dict) or not raw_lanes:
        raise ConfigError("the lanes file defines no lanes ([lanes.<name>] tables)", field="lanes")
    lanes = tuple(_lane_from(validate_lane_name(n), raw) for n, raw in raw_lanes.items())
    engine = parse_engine_table(data.get("engine", {}), "engine")
    workers, tables = _workers_from(data.get("workers"), lanes, engine)
    return LaneTable(lanes=lanes, workers=workers, engine=engine,
                     engine_tables=((("engine", engine),) if engine else ()) + tuple(tables))


def default_lanes_path() -> Path:
    return Path(str(resources.files("tailguard.lanes").joinpath("lanes.toml")))


def cpu_lanes_path() -> Path:
    """The packaged lanes file sized for a CPU host: lanes.toml with a smaller short lane."""
    return Path(str(resources.files("tailguard.lanes").joinpath("lanes-cpu.toml")))


def lanes_file_for_host(device: str, given: str | Path | None) -> tuple[Path, str]:
    """The lanes file `tailguard up` runs with on a host of this `device` kind (``cpu`` or
    ``cuda``), and why: the file `given` (TAILGUARD_LANES or ``--lanes``) if any, else the
    packaged one sized for the host. The packaged default's 16 short slots and 1 s promise
    are a GPU's: on a 2-core CPU host they let accepted short requests reach 17.9x their
    quiet P99 under overload (docs/benchmarks.md), lanes-cpu.toml's 6 slots 1.2-1.4x."""
    if given:
        return Path(given), f"given by {settings.LANES_FILE.env} or --lanes"
    if device == "cpu":
        return cpu_lanes_path(), ("no GPU on this host: the packaged CPU-sized file (6 short "
                                  f"slots); {settings.LANES_FILE.env} names another")
    return default_lanes_path(), f"a {device} host: the packaged default"


def load_lanes(path: str | Path | None = None) -> LaneTable:
    """Load the lanes file: `path`, else $TAILGUARD_LANES, else the packaged default."""
    path = Path(path or settings.LANES_FILE.get() or default_lanes_path())
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"lanes file not found: {path}", field=settings.LANES_FILE.env) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}", field=settings.LANES_FILE.env) from None
    try:
        table = parse_lanes(data)
        check_job_ttl(table, settings.JOB_TTL_S.get(), settings.WORKER_LOST_GRACE_S.get())
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc.message}", field=exc.field) from None
    return dataclasses.replace(table, source=str(path))


def check_job_ttl(table: LaneTable, job_ttl_s: float, grace_s: float) -> None:
    """A job record must outlive its longest legitimate life in every lane (queue wait +
    deadline + the worker-lost grace): one that expires first vanishes mid-run, and its
    late end is announced for a record nobody can read."""
    for lane in table.lanes:
        need = lane.queue_ttl_s + lane.deadline_s + grace_s
        if job_ttl_s <= need:
            raise ConfigError(
                f"{settings.JOB_TTL_S.env}={job_ttl_s:g} must exceed lane {lane.name!r}'s "
                f"queue_ttl_s + deadline_s + {settings.WORKER_LOST_GRACE_S.env} = {need:g} s",
                field=settings.JOB_TTL_S.env)
