"""Every way a worker is started names it NAME@%h: Flower's Workers tab, `celery inspect` and
/healthz (through `host_of`) then show which host serves which lane."""

import json
import re
import socket

import pytest
import yaml
from celery.utils.nodenames import host_format
from click.testing import CliRunner
from conftest import ROOT

from tailguard import cli
from tailguard.jobs.liveness import host_of, node_name
from tailguard.lanes.table import load_lanes


def test_a_node_name_is_the_worker_then_celerys_host():
    assert node_name("short") == "short@%h"
    expanded = host_format(node_name("short-a0"))  # what the Celery worker does with -n
    assert expanded == f"short-a0@{socket.gethostname()}"
    assert host_of(expanded) == socket.gethostname()


@pytest.mark.parametrize("bad", ["", "short@gpu-a", "@"])
def test_a_worker_name_with_an_at_or_none_is_refused(bad):
    with pytest.raises(ValueError):
        node_name(bad)


def test_tailguard_worker_runs_celery_under_the_node_name(monkeypatch):
    """`tailguard worker` is what the Procfile, `tailguard up` (via tailguard.host.procs.worker_spec)
    and the systemd units run."""
    import tailguard.model.served

    seen = []
    # the model is resolved elsewhere (tailguard/model/served.py); here only the argv counts
    monkeypatch.setattr(tailguard.model.served, "served_model", lambda: ("/models/any", False))
    monkeypatch.setattr(cli, "become", lambda argv, env, **_: seen.append((argv, env)))
    for spec in load_lanes().workers:
        result = CliRunner().invoke(cli.main, ["worker", "--worker", spec.name])
        assert result.exit_code == 0, result.output
        argv, env = seen.pop()
        assert argv[argv.index("-n") + 1] == node_name(spec.name)
        assert argv[argv.index("-Q") + 1] == ",".join(spec.lanes)
        assert env["TAILGUARD_WORKER"] == spec.name  # the entry whose engine table it builds
    # a replica of the shipped `engine` (replicas = "fill"): a node of its own, engine's entry
    from tailguard.lanes.table import default_lanes_path

    monkeypatch.setenv("TAILGUARD_LANES", str(default_lanes_path()))
    result = CliRunner().invoke(cli.main, ["worker", "--worker", "engine-3", "--gpu", "3"])
    assert result.exit_code == 0, result.output
    argv, env = seen.pop()
    assert argv[argv.index("-n") + 1] == node_name("engine-3")
    assert (argv[argv.index("-Q") + 1], env["TAILGUARD_WORKER"]) == ("short,long,batch", "engine")
    result = CliRunner().invoke(cli.main, ["worker", "--worker", "short-2"])
    assert result.exit_code != 0 and "no worker named 'short-2'" in str(result.exception)


def test_containers_name_their_workers_the_same_way():
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    commands = [svc["command"] for svc in compose["services"].values()
                if svc.get("command", [])[:4] == ["celery", "-A", "tasks", "worker"]]
    cmd_line = re.search(r"^CMD (.*)$", (ROOT / "docker" / "Dockerfile.worker").read_text(), re.MULTILINE)
    commands.append(json.loads(cmd_line.group(1)))
    assert len(commands) >= 3
    from tailguard.lanes.table import default_lanes_path, load_lanes

    shipped = load_lanes(default_lanes_path())
    for argv in commands:
        name = argv[argv.index("-n") + 1].split("@")[0]
        assert argv[argv.index("-n") + 1] == node_name(name), argv
        # named after its [[workers]] entry (or a replica of it), serving that entry's lanes
        assert argv[argv.index("-Q") + 1] == ",".join(shipped.worker(name).lanes), argv
