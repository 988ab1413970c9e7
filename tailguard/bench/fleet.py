"""The `fleet` peer: one tuned vLLM server per engine, behind vLLM's own router.

What users deploy instead of tailguard on the same hardware: one `vllm serve` replica per
engine tailguard runs (each on that engine's cores or GPUs, with its batch slots; the
largest context of the lanes, so any replica takes any request), each tuned as
``direct-tuned`` is (priority scheduling, chunked prefill with the sweep's first
``--max-num-batched-tokens`` and ``--long-prefill-token-threshold``), and vLLM's router
(the ``vllm-router`` package, a Rust binary: ``pip install 'tailguard[bench]'``) in front
with its own defaults. The load generator sends each class a vLLM ``priority``, which the
router forwards.

* ``fleet``: the router's default policy, ``cache_aware`` (the replica whose past requests
  share the longest prefix, else the one with the smallest record; least-loaded only once
  the busiest replica has ``--balance-abs-threshold`` 64 more requests than the idlest);
* ``fleet-p2``: ``power_of_two`` (the less loaded of two replicas drawn at random).

Each replica is placed as tailguard places its own worker: its server process (HTTP,
tokenization, the token stream: tailguard's API and worker threads) on the front-end cores,
and once it is up, vLLM's processes under it (the engine core, which busy-polls while a step
runs, and the model runner) on its engine's cores, its compute threads bound there
(``VLLM_CPU_OMP_THREADS_BIND``), at ``TAILGUARD_ENGINE_NICE`` where those are front-end
cores; its KV cache is one engine's (``VLLM_CPU_KVCACHE_SPACE``). Left anywhere, each
replica's engine core polled on the other replica's core and took half of it. The router runs
on the front-end cores too. The specs are pure; only `RunningFleet` starts processes.
"""

from __future__ import annotations

import shutil
import sys
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tailguard import settings
from tailguard.bench.topology import (
    FLEET,
    FLEET_P2,
    DirectSpec,
    RunningTopology,
    TopologyError,
    WorkerPlan,
    direct_spec,
)
from tailguard.bench.tuned import check_setting, tuned_flags
from tailguard.host.procfs import descendants, move_threads, renice
from tailguard.host.procs import ChildFailed, ChildSpec, Group
from tailguard.host.redis_server import free_port, port_in_use
from tailguard.lanes.table import LaneTable

#: The router's load-balancing policy of each fleet topology (vllm-router's --policy).
POLICIES = {FLEET: "cache_aware", FLEET_P2: "power_of_two"}
#: The router's console script, installed beside this Python by the `bench` extra.
ROUTER = "vllm-router"


@dataclass(frozen=True)
class FleetSpec:
    """Replicas behind a router (the module docstring): the `fleet` topologies."""

    name: str
    replicas: tuple[DirectSpec, ...]
    policy: str = POLICIES[FLEET]
    cpus: tuple[int, ...] = ()  # where the router runs: the front-end cores

    @property
    def workers(self) -> tuple[WorkerPlan, ...]:
        """One engine per replica, for the report and the warm-up (they serve no lane)."""
        return tuple(WorkerPlan(r.name, (), r.pin) for r in self.replicas)

    def engine_slots(self) -> dict[str, int]:
        return {r.name: r.max_num_seqs for r in self.replicas}

    def engine_nice(self, replica: DirectSpec, nice: int | None = None) -> int:
        """The nice value of a replica's vLLM processes: `nice` (TAILGUARD_ENGINE_NICE) when
        its cores include a front-end core, as tailguard's engine there runs; else 0."""
        nice = settings.ENGINE_NICE.get() if nice is None else nice
        return max(0, nice) if set(replica.pin.cores) & set(self.cpus) else 0

    def router_argv(self, port: int, replica_ports: list[int], metrics_port: int,
                    router: str | None = None) -> tuple[str, ...]:
        """vllm-router in front of the replicas on `replica_ports`: its defaults but the
        policy; its own Prometheus port given (its default, 29000, may be taken), and the
        replicas checked every second at start (they are up already: its default waits 30 s)."""
        return (router or router_path(), "--host", "127.0.0.1", "--port", str(port),
                "--worker-urls", *(f"http://127.0.0.1:{p}" for p in replica_ports),
                "--policy", self.policy, "--worker-startup-check-interval", "1",
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
                "--log-level", "warning")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "engines": [w.to_dict() for w in self.workers],
                "router": ROUTER, "policy": self.policy,
                "replicas": [r.to_dict() for r in self.replicas]}


def router_path() -> str:
    """The vllm-router executable: beside this Python (a venv's bin), else on PATH."""
    beside = Path(sys.executable).parent / ROUTER
    found = str(beside) if beside.is_file() else shutil.which(ROUTER)
    if not found:
        raise TopologyError(f"no {ROUTER} executable: pip install 'tailguard[bench]' "
                            "(the fleet topologies run vLLM's own router)")
    return found


def fleet_specs(engines: tuple[WorkerPlan, ...], table: LaneTable, tuned: tuple[int, int], *,
                max_model_len: int | None = None, dtype: str = "auto",
                cpus: tuple[int, ...] = (), frontend: tuple[int, ...] = ()) -> list[FleetSpec]:
    """`fleet` and `fleet-p2`: a replica per engine of `engines` (its pin and batch slots, one
    engine's KV cache), each with the largest context of all of them (capped at
    `max_model_len`) and the tuned flags of `tuned` (batched tokens, long-prefill threshold)."""
    context = direct_spec(engines[0].pin, engines, table, max_model_len=max_model_len).max_model_len
    replicas = []
    for i, w in enumerate(engines):
        one = direct_spec(w.pin, (w,), table, max_model_len=max_model_len, dtype=dtype, cpus=cpus)
        check_setting(*tuned, max_num_seqs=one.max_num_seqs, max_model_len=context)
        # the server on the front-end cores; its engine moved to its own once up (RunningFleet)
        replicas.append(replace(one, name=f"replica-{i}", max_model_len=context,
                                extra_args=tuned_flags(*tuned),
                                cpus=frontend if w.pin.cores and frontend else cpus))
    return [FleetSpec(name, tuple(replicas), policy, cpus=frontend)
            for name, policy in POLICIES.items()]


class RunningFleet(RunningTopology):
    """The replicas, then the router once every replica answers /health; ready when the
    router lists the model (it has found its workers)."""

    spec: FleetSpec  # type: ignore[assignment]

    def __init__(self, spec: FleetSpec, *, model: str, workdir: Path, api_port: int,
                 replica_ports: list[int], metrics_port: int) -> None:
        self.spec = spec  # type: ignore[assignment]
        self.model = model
        self.workdir = Path(workdir)
        self.api_port = api_port
        self.replica_ports = list(replica_ports)
        self.metrics_port = metrics_port
        self.group = Group(self.workdir)
        self._last_health = None

    @property
    def replica_urls(self) -> dict[str, str]:
        """Each replica's own server, by its name (its /metrics: how the router split the load)."""
        return {r.name: f"http://127.0.0.1:{p}" for r, p in zip(self.spec.replicas,
                                                                self.replica_ports)}

    @property
    def engine_metrics_urls(self) -> dict[str, str]:
        return {name: url + "/metrics" for name, url in self.replica_urls.items()}

    def start(self, timeout_s: float = 600.0) -> str:
        with self._killed_on_failure():
            for r, port in zip(self.spec.replicas, self.replica_ports):
                self.group.start(ChildSpec(r.name, r.argv(self.model, port),
                                           env={**r.env(), "PYTHONUNBUFFERED": "1"}, cpus=r.cpus))
            try:
                self.group.wait_until(lambda: all(_answers(u + "/health")
                                                  for u in self.replica_urls.values()),
                                      timeout_s, "vLLM replicas healthy")
                for r in self.spec.replicas:
                    self._place_engine(r)
                # ports picked before the replicas started may be theirs now (vLLM binds ports
                # of its own as it starts): the router's are picked again where taken
                self.api_port, self.metrics_port = map(_still_free, (self.api_port,
                                                                     self.metrics_port))
                self.group.start(ChildSpec("router", self.spec.router_argv(
                    self.api_port, self.replica_ports, self.metrics_port), cpus=self.spec.cpus))
                self.group.wait_until(lambda: _answers(self.url + "/v1/models"), 120.0,
                                      "vllm-router answering")
            except ChildFailed as exc:
                raise TopologyError(str(exc)) from None
        return self.url

    def _place_engine(self, replica: DirectSpec) -> None:
        """vLLM's processes under `replica`'s server onto its engine's cores (its compute
        threads are bound there already), at its engine nice."""
        if not replica.pin.cores:
            return  # a GPU replica: nothing to place
        engine = descendants(self.group[replica.name].proc.pid)
        move_threads(engine, replica.pin.cores)
        nice = self.spec.engine_nice(replica)
        if nice:
            renice(engine, nice)


def _answers(url: str) -> bool:
    """Whether `url` answers 200 now."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status == 200
    except (OSError, ValueError):
        return False


def _still_free(port: int) -> int:
    """`port` if nothing listens on it now, else another free one."""
    return free_port() if port_in_use(port) else port
