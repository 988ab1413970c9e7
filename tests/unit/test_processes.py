"""Every way tailguard ships starts the processes of tailguard/launch/processes.py, with the
same commands and warm-stop times: `tailguard up`, the Procfile, docker compose, the Kubernetes
manifests (one test per way). Pure: the files are read, `up`'s children are planned, nothing
starts."""

from __future__ import annotations

import shlex

import pytest
import yaml
from conftest import ROOT

from tailguard.lanes.table import LaneTable, default_lanes_path, load_lanes
from tailguard.launch.processes import API, FLOWER, REDIS, WORKER, Process, deployment

#: options that place a process on this host (each way places its own way)
PLACEMENT_OPTIONS = ("--cores", "--gpu", "--host", "--port", "--metrics-port")


@pytest.fixture(scope="module")
def shipped() -> LaneTable:
    """The lanes file the package, the images and the manifests ship; not the test lanes."""
    return load_lanes(default_lanes_path())


@pytest.fixture(scope="module")
def processes(shipped) -> dict[str, Process]:
    return {p.name: p for p in deployment(shipped)}


def unplaced(args: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """`args` without the options (and their values) that place a process."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in PLACEMENT_OPTIONS:
            skip = True
        elif not arg.startswith(tuple(f"{o}=" for o in PLACEMENT_OPTIONS)):
            out.append(arg)
    return tuple(out)


def test_a_deployment_is_redis_the_api_one_worker_kind_per_entry_and_flower(shipped, processes):
    roles = [p.role for p in processes.values()]
    assert roles == [REDIS, API, *[WORKER] * len(shipped.workers), FLOWER]  # no controller
    for w in shipped.workers:
        worker = processes[f"worker-{w.name}"]
        assert worker.lanes == w.lanes and worker.argv == ("tailguard", "worker", "--worker", w.name)
        # a warm stop outlasts the longest deadline of the lanes it serves
        assert worker.stop_grace_s > max(shipped[lane].deadline_s for lane in w.lanes)


def kind_of(name: str, shipped: LaneTable) -> str:
    """A process name's kind: a worker replica's (`worker-engine-2`) is its entry's."""
    if name.startswith("worker-"):
        return f"worker-{shipped.worker(name[len('worker-'):]).name}"
    return name


def test_the_procfile_runs_the_processes(processes, shipped):
    """One line per process; a worker kind may have several (one per core: the replicas of
    its entry, each a `--worker` name of its own)."""
    procfile: dict[str, set] = {}
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, command = line.split(":", 1)
            args = unplaced(shlex.split(command))
            if args[:2] == ("tailguard", WORKER):
                args = (*args[:3], shipped.worker(args[3]).name, *args[4:])
            procfile.setdefault(kind_of(name.strip(), shipped), set()).add(args)
    assert procfile == {name: {p.argv} for name, p in processes.items()}


def test_tailguard_up_starts_the_processes(shipped, processes, monkeypatch):
    """`up` adopts its embedded Redis itself (or uses TAILGUARD_REDIS_URL's), then the children
    planned here; a worker kind may have several placed replicas."""
    from tailguard.host.procs import RestartPolicy
    from tailguard.launch import supervisor
    from tailguard.launch.worker_placement import place_workers

    binds = supervisor.Binds("127.0.0.1", 8000, 5555, 6379)
    specs = supervisor._child_specs(binds, place_workers(shipped.workers, "cpu"), shipped, {},
                                    "admin:x", RestartPolicy(1.0, 5, 60.0), ())
    started = {}
    for spec in specs:
        args = unplaced(spec.argv[spec.argv.index("tailguard.cli") + 1:])
        name = spec.name.replace("worker.", "worker-")
        kind = f"worker-{shipped.worker(args[2]).name}" if args[0] == WORKER else name
        started.setdefault(kind, set()).add((("tailguard", *args), spec.stop_timeout_s
                                             if args[0] == WORKER else 0.0))
    expected = {name: {(p.argv, p.stop_grace_s)} for name, p in processes.items()
                if p.role != REDIS}
    assert started == expected


def test_docker_compose_runs_the_processes(shipped, processes):
    """Compose spells the worker and Flower as the Celery commands `tailguard worker` and
    `tailguard flower` become (their images run them so); each worker service is a kind."""
    services = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())["services"]
    tailguard_services = {kind_of(name, shipped) for name in services
                          if name in processes or name.startswith("worker-")}
    assert tailguard_services == set(processes)
    assert services[REDIS]["command"][0] == "redis-server"
    assert tuple(services[API]["command"][:2]) == processes[API].argv
    assert services[FLOWER]["command"][:4] == ["celery", "-A", "tasks", "flower"]
    for service, svc in services.items():
        if not service.startswith("worker-"):
            continue
        p = processes[kind_of(service, shipped)]
        command = svc["command"]
        assert command[:4] == ["celery", "-A", "tasks", "worker"]
        assert tuple(command[command.index("-Q") + 1].split(",")) == p.lanes
        assert command[command.index("-n") + 1] == f"{service[len('worker-'):]}@%h"
        assert duration_s(svc["stop_grace_period"]) >= p.stop_grace_s, service


def duration_s(text: str) -> float:
    """A compose duration such as 990s or 2m30s, in seconds."""
    import re

    units = {"h": 3600, "m": 60, "s": 1}
    parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", text)
    assert "".join(n + u for n, u in parts) == text, text
    return sum(float(n) * units[u] for n, u in parts)
