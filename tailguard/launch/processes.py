"""The processes of a deployment, in one list: what every way tailguard ships starts.

Redis, the API, the workers (one kind per [[workers]] entry of the lanes file: any number of
identical processes, each one engine serving that entry's lanes in order) and Flower; no
other process. `tailguard up` takes each worker's warm-stop time from here; the Procfile,
docker/compose.yaml and deploy/kubernetes/ are checked against this list by
tests/unit/test_processes.py, one test per way, so a way that drifts (a process more or
less, another command, a shorter stop) fails there.
"""

from __future__ import annotations

from dataclasses import dataclass

from tailguard.host.procs import STOP_TIMEOUT_S
from tailguard.lanes.table import LaneTable

REDIS, API, WORKER, FLOWER = "redis", "api", "worker", "flower"


@dataclass(frozen=True)
class Process:
    """One process of a deployment (a kind of them, for workers)."""

    #: its name everywhere: Procfile entry, compose service, Kubernetes object
    name: str
    #: the `tailguard` subcommand that runs it, with its options (no binds, no pinning: each
    #: way adds its own)
    args: tuple[str, ...]
    #: a worker's lanes, in the order it serves them
    lanes: tuple[str, ...] = ()
    #: how long a warm stop may take before the process is killed (0: at once)
    stop_grace_s: float = 0.0

    @property
    def role(self) -> str:
        return self.args[0]

    @property
    def argv(self) -> tuple[str, ...]:
        return ("tailguard", *self.args)


def worker_stop_timeout_s(table: LaneTable, lanes: tuple[str, ...] | list[str]) -> float:
    """A warm shutdown finishes the requests a worker runs (each ends by its lane deadline)
    and then stops the engine: the longest deadline among its lanes plus STOP_TIMEOUT_S."""
    return max(table[lane].deadline_s for lane in lanes) + STOP_TIMEOUT_S


def worker_process_name(entry: str) -> str:
    """The process (service, Deployment) name of a [[workers]] entry's workers."""
    return f"{WORKER}-{entry}"


def deployment(table: LaneTable) -> list[Process]:
    """The processes of a deployment serving `table`, in the order they start (they stop in
    reverse, Redis last: the workers need it to shut down)."""
    workers = [Process(worker_process_name(w.name), (WORKER, "--worker", w.name), lanes=w.lanes,
                       stop_grace_s=worker_stop_timeout_s(table, w.lanes))
               for w in table.workers]
    return [Process(REDIS, (REDIS,)), Process(API, (API,)), *workers, Process(FLOWER, (FLOWER,))]
